# One H200 (after call2, which its machine's 7B preparation cut the full run 3 of): 7B full fine-tuning run 3,
# then 7B LoRA r64 runs 2 and 3, at the defaults
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
W=/tmp/b7; M=$W/models/qwen2.5-7b
[ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M','qwen2.5-7b',weights=True)" > $OUT/prep.log 2>&1
python -c "from pathlib import Path; import sys; sys.path.insert(0, 'benchmarks'); from grpo_step import make_prompts as m; print(m(Path('$W/data'), Path('$M'), 256, 256))" >> $OUT/prep.log 2>&1
echo "prep done t=$SECONDS"
timeout 200 python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --workdir $W \
   --variants full --out $OUT/hybridrl_qwen2.5-7b_full_run3.json > $OUT/hybridrl_7b_full_run3.log 2>&1; echo "full rc=$? t=$SECONDS"
grep -E "^\[bench\]" $OUT/hybridrl_7b_full_run3.log | cut -c1-200
L="actor_rollout_ref.model.lora_rank=64;actor_rollout_ref.model.lora_alpha=128"
timeout $((595-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --repeat 2 \
   --workdir $W --variants "lora64:$L" --out $OUT/hybridrl_qwen2.5-7b_lora_runs23.json > $OUT/hybridrl_7b_lora_runs23.log 2>&1
echo "lora rc=$? t=$SECONDS"
grep -E "^\[bench\]" $OUT/hybridrl_7b_lora_runs23.log | cut -c1-200
