# One H200 (warm, after call1): 7B full fine-tuning run 3 at the defaults, TRL full (bf16 weights) one timed step
# after its warm-up on the same model and prompts, then 7B LoRA r64 run 1
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
W=/tmp/b7; M=$W/models/qwen2.5-7b
timeout 200 python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --workdir $W \
   --variants full --out $OUT/hybridrl_qwen2.5-7b_full_run3.json > $OUT/hybridrl_7b_full_run3.log 2>&1; echo "full rc=$? t=$SECONDS"
grep -E "^\[bench\]" $OUT/hybridrl_7b_full_run3.log | cut -c1-200
DATA=$(ls $W/data/prompts_*x256.parquet | head -1)
timeout 260 python benchmarks/trl_grpo.py --model $M --prompts $DATA --steps 1 --batch-prompts 64 --n 8 \
   --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --gradient-checkpointing --ignore-eos --reward last_int \
   --lora-rank 0 --lora-alpha 128 --out $OUT/trl_qwen2.5-7b_lora0.json > $OUT/trl_7b_lora0.log 2>&1
echo "trl lora0 rc=$? t=$SECONDS"; tail -1 $OUT/trl_7b_lora0.log | cut -c1-300
L="actor_rollout_ref.model.lora_rank=64;actor_rollout_ref.model.lora_alpha=128"
timeout $((595-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --repeat 1 \
   --workdir $W --variants "lora64:$L" --out $OUT/hybridrl_qwen2.5-7b_lora_run1.json > $OUT/hybridrl_7b_lora_run1.log 2>&1
echo "lora rc=$? t=$SECONDS"
grep -E "^\[bench\]|auto:" $OUT/hybridrl_7b_lora_run1.log | cut -c1-330 | head -8
