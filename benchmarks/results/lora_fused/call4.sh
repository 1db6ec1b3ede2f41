# One H200 (warm, after call3): 7B full fine-tuning run 3 at the defaults, then TRL + peft r64 and TRL full (bf16
# weights), one timed step each after the warm-up, on the same model and prompts
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
W=/tmp/b7; M=$W/models/qwen2.5-7b
timeout 200 python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --workdir $W \
   --variants full --out $OUT/hybridrl_qwen2.5-7b_full_run3.json > $OUT/hybridrl_7b_full_run3.log 2>&1; echo "full rc=$? t=$SECONDS"
grep -E "^\[bench\]" $OUT/hybridrl_7b_full_run3.log | cut -c1-200
DATA=$(ls $W/data/prompts_*x256.parquet | head -1)
for lora in 64 0; do
  timeout $((590-SECONDS)) python benchmarks/trl_grpo.py --model $M --prompts $DATA --steps 1 --batch-prompts 64 --n 8 \
     --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --gradient-checkpointing --ignore-eos --reward last_int \
     --lora-rank $lora --lora-alpha 128 --out $OUT/trl_qwen2.5-7b_lora$lora.json > $OUT/trl_7b_lora$lora.log 2>&1
  echo "trl lora$lora rc=$? t=$SECONDS"; tail -1 $OUT/trl_7b_lora$lora.log | cut -c1-300
done
