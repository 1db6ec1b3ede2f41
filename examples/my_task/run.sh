#!/usr/bin/env bash
# GRPO on your own data with your own reward, as docs/your-own-run.md walks through:
#   MODEL=~/models/Qwen2.5-0.5B-Instruct DATA=examples/my_task/questions.jsonl GPUS=1 bash examples/my_task/run.sh
# 1. `hybridrl data convert` turns the JSONL (question / answer columns) into the trainer's parquet schema;
# 2. `hybridrl config check` validates the run and prints its memory plan before any GPU time is spent;
# 3. `hybridrl train` runs GRPO scored by reward.py (verl's custom_reward_function keys).
# Without MODEL a tiny random model is made (`hybridrl assets tiny-model`): the pipeline runs, nothing is learned.
# Extra arguments are config overrides (key=value), e.g. trainer.total_training_steps=100.
# HYBRIDRL_DRY_RUN=1 stops after the check.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA=${DATA:-$here/questions.jsonl}
OUT=${OUT:-$HOME/data/my_task}
GPUS=${GPUS:-1}
if [ -z "${MODEL:-}" ]; then
  MODEL=$HOME/models/tiny
  [ -f "$MODEL/config.json" ] || hybridrl assets tiny-model "$MODEL"
fi
hybridrl data convert "$DATA" --out "$OUT/train.parquet" --prompt-key question --answer-key answer \
  --answer-after '####' --data-source my_task \
  --prompt-template '{question} Show your working, then give the answer after "####".'
args=(
  actor_rollout_ref.model.path=$MODEL
  data.train_files=$OUT/train.parquet data.val_files=null
  data.max_prompt_length=256 data.max_response_length=256
  data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.rollout.n=8
  custom_reward_function.path=$here/reward.py custom_reward_function.name=compute_score
  trainer.n_gpus_per_node=$GPUS trainer.total_training_steps=20 trainer.experiment_name=my_task
  "$@"
)
hybridrl config check "${args[@]}"
[ "${HYBRIDRL_DRY_RUN:-0}" = 1 ] && exit 0
exec hybridrl train "${args[@]}"
