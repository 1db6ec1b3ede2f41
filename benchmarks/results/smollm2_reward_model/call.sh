# issue 19: land the real model's second half, then the reward-model-driven GRPO recipe on SmolLM2 (gpu_suite 12)
set -u
bash .real/b/land.sh > $OUT/land.log 2>&1 || { cat $OUT/land.log; exit 1; }
source gpu_calls/common.sh
export PYTHONUNBUFFERED=1
[ -f /tmp/smollm2_add/train.parquet ] || python examples/smollm2_arith/make_data.py --out /tmp/smollm2_add --train 3000 --test 200 --seed 0
VERL_FILE_LOGGER_PATH=$OUT/smollm2_rm_metrics.jsonl MODEL=/tmp/smollm2 DATA=/tmp/smollm2_add RM=/tmp/smollm2_rm \
   timeout $((585-SECONDS)) bash examples/smollm2_reward_model/run.sh trainer.total_training_steps=40 > $OUT/rm_run.log 2>&1
echo "rm run rc=$? t=$SECONDS"
cp /tmp/smollm2_rm/rm_eval.json $OUT/ 2>/dev/null
grep -hE "val-core|rm_eval|accuracy|auc" $OUT/rm_run.log | cut -c1-250 | tail -12
