# Sourced with the run number: TRL GRPOTrainer full fine-tuning, bf16 weights, its warm-up step then two timed
# steps, on the model and prompts of prep7b.sh
DATA=$(ls $W/data/prompts_*x256.parquet | head -1)
timeout 300 python benchmarks/trl_grpo.py --model $M --prompts $DATA --steps 2 --batch-prompts 64 --n 8 \
   --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --gradient-checkpointing --ignore-eos --reward last_int \
   --out $OUT/trl_qwen2.5-7b_full_run$1.json > $OUT/trl_7b_full_run$1.log 2>&1
echo "trl run $1 rc=$? t=$SECONDS"; tail -1 $OUT/trl_7b_full_run$1.log | cut -c1-300
