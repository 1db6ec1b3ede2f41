# One H200: the 7B LoRA r64 update alone with the fused LoRA linear vs peft's forward (profile_update.py, same
# model, checkpointing on, 32 rows per micro-batch = the plan's default), then one more 7B full fine-tuning GRPO
# run at the defaults (issue 14's runs per configuration)
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
W=/tmp/b7; M=$W/models/qwen2.5-7b
[ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M','qwen2.5-7b',weights=True)" > $OUT/prep.log 2>&1
python -c "from pathlib import Path; import sys; sys.path.insert(0, 'benchmarks'); from grpo_step import make_prompts as m; print(m(Path('$W/data'), Path('$M'), 256, 256))" >> $OUT/prep.log 2>&1
echo "prep done t=$SECONDS" | tee -a $OUT/prep.log
timeout 240 python benchmarks/profile_update.py --preset qwen2.5-7b --workdir $W --rows 512 --prompt-len 256 \
   --response-len 256 --repeat 1 --configs lora64:ckpt:32,lora64:ckpt:32:peft \
   --out $OUT/profile_update_lora_fused_vs_peft.json > $OUT/profile_update.log 2>&1; echo "profile rc=$? t=$SECONDS"
grep "^\[update\]" $OUT/profile_update.log
timeout $((585-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --workdir $W \
   --variants full --out $OUT/hybridrl_qwen2.5-7b_full_run2.json > $OUT/hybridrl_7b_full_run2.log 2>&1; echo "full rc=$? t=$SECONDS"
grep -E "^\[bench\]" $OUT/hybridrl_7b_full_run2.log | cut -c1-300
