# One H200 (warm, after call3): 7B full fine-tuning with bf16 masters (fsdp_config.model_dtype=bf16, TRL's
# precision), one run, then TRL + peft r64 one timed step after its warm-up, same model and prompts
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
W=/tmp/b7; M=$W/models/qwen2.5-7b
timeout 200 python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --workdir $W \
   --variants "bf16:actor_rollout_ref.actor.fsdp_config.model_dtype=bf16" \
   --out $OUT/hybridrl_qwen2.5-7b_full_bf16.json > $OUT/hybridrl_7b_full_bf16.log 2>&1; echo "bf16 rc=$? t=$SECONDS"
grep -E "^\[bench\]|auto:" $OUT/hybridrl_7b_full_bf16.log | cut -c1-330 | head -8
DATA=$(ls $W/data/prompts_*x256.parquet | head -1)
timeout $((500-SECONDS)) python benchmarks/trl_grpo.py --model $M --prompts $DATA --steps 1 --batch-prompts 64 --n 8 \
   --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --gradient-checkpointing --ignore-eos --reward last_int \
   --lora-rank 64 --lora-alpha 128 --out $OUT/trl_qwen2.5-7b_lora64.json > $OUT/trl_7b_lora64.log 2>&1
echo "trl lora64 rc=$? t=$SECONDS"; tail -1 $OUT/trl_7b_lora64.log | cut -c1-300
