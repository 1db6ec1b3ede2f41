# 7B LoRA r64 on one H200: hybridrl at the defaults (checkpointing auto -> off, micro 4) and with checkpointing
# forced on, side by side with TRL + peft (bf16, its default checkpointing); then pytest -m gpu if time is left
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
W=/tmp/b7; M=$W/models/qwen2.5-7b
[ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M','qwen2.5-7b',weights=True)" > $OUT/prep.log 2>&1
python -c "from pathlib import Path; import sys; sys.path.insert(0, 'benchmarks'); from grpo_step import make_prompts as m; print(m(Path('$W/data'), Path('$M'), 256, 256))" >> $OUT/prep.log 2>&1
echo "prep done t=$SECONDS" | tee -a $OUT/prep.log
L="actor_rollout_ref.model.lora_rank=64;actor_rollout_ref.model.lora_alpha=128"
timeout $((400-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --workdir $W \
   --variants "lora64:$L,lora64_ckpt:$L;actor_rollout_ref.model.enable_gradient_checkpointing=true" \
   --out $OUT/hybridrl_qwen2.5-7b_lora.json > $OUT/hybridrl_7b_lora.log 2>&1; echo "hybridrl rc=$? t=$SECONDS"
DATA=$(ls $W/data/prompts_*x256.parquet | head -1)
timeout $((585-SECONDS)) python benchmarks/trl_grpo.py --model $M --prompts $DATA --steps 1 --batch-prompts 64 --n 8 \
   --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --gradient-checkpointing --ignore-eos --reward last_int \
   --lora-rank 64 --lora-alpha 128 --out $OUT/trl_qwen2.5-7b_lora64.json > $OUT/trl_7b_lora64.log 2>&1; echo "trl rc=$? t=$SECONDS"
tail -1 $OUT/trl_7b_lora64.log | cut -c1-400
grep -E "^\[bench\]|auto:" $OUT/hybridrl_7b_lora.log | cut -c1-300 | tail -20
