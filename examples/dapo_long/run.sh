#!/usr/bin/env bash
# DAPO-style long-reasoning GRPO, written with verl's keys as its DAPO recipes pass them (clip-higher, token-mean loss,
# dynamic sampling, the overlong buffer through reward_kwargs, dynamic batch sizes, rollouts dumped to disk), so a
# verl command line of this shape carries over. Responses up to 8,192 tokens; the run plan sizes the micro-batches by
# tokens, the KV cache and the recompute for the model and GPUs it is given (`hybridrl config check` shows it).
#
#   bash examples/dapo_long/run.sh 1.5b 1 [extra key=value overrides]
#
# MODEL: a local HF model directory (default: a random-weight Qwen2.5 of that size, made offline); DATA: a directory
# with train.parquet / test.parquet in verl's schema (default: `hybridrl data make gsm8k-synthetic`).
# MAX_PROMPT_LENGTH / MAX_RESPONSE_LENGTH: the lengths (default 1,024 / 8,192; the overlong buffer is the last quarter
# of the responses' budget). HYBRIDRL_DRY_RUN=1 only validates the config and prints the plan.
# Not taken from verl's recipe: rollout.enable_chunked_prefill (the engine prefills each prompt in one step) and
# model.use_fused_kernels (the fused log-prob head always runs); both are refused as unknown keys.
set -euo pipefail
size=${1:?0.5b, 1.5b or 7b}; gpus=${2:?number of GPUs, e.g. 1 or 8}; shift 2
case $size in 0.5b|1.5b|7b) ;; *) echo "size must be 0.5b, 1.5b or 7b, got $size" >&2; exit 2 ;; esac
MODEL=${MODEL:-$HOME/models/qwen2.5-$size-random}
DATA=${DATA:-$HOME/data/gsm8k-synthetic}
RUN=${RUN:-checkpoints/dapo_long/qwen2.5_${size}_${gpus}gpu}
max_prompt_length=${MAX_PROMPT_LENGTH:-1024}
max_response_length=${MAX_RESPONSE_LENGTH:-8192}
train_prompt_bsz=$(( 16 * gpus ))

args=(
  data.train_files=$DATA/train.parquet data.val_files=$DATA/test.parquet data.prompt_key=prompt data.truncation=left
  data.max_prompt_length=$max_prompt_length data.max_response_length=$max_response_length
  data.train_batch_size=$train_prompt_bsz data.gen_batch_size=$(( train_prompt_bsz * 2 ))
  actor_rollout_ref.model.path=$MODEL
  actor_rollout_ref.rollout.n=8
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false algorithm.kl_ctrl.kl_coef=0.0
  algorithm.filter_groups.enable=true algorithm.filter_groups.metric=acc algorithm.filter_groups.max_num_gen_batches=10
  actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.actor.kl_loss_coef=0.0
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28
  actor_rollout_ref.actor.clip_ratio_c=10.0 actor_rollout_ref.actor.loss_agg_mode=token-mean
  actor_rollout_ref.model.use_remove_padding=true
  actor_rollout_ref.actor.use_dynamic_bsz=true
  actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true
  actor_rollout_ref.actor.ppo_mini_batch_size=$train_prompt_bsz
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.lr_warmup_steps=10
  actor_rollout_ref.actor.optim.weight_decay=0.1 actor_rollout_ref.actor.grad_clip=1.0
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 actor_rollout_ref.ref.ulysses_sequence_parallel_size=1
  actor_rollout_ref.actor.checkpoint.save_contents="['model', 'optimizer', 'extra']"
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.8
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1
  actor_rollout_ref.rollout.val_kwargs.temperature=1.0 actor_rollout_ref.rollout.val_kwargs.top_p=0.7
  actor_rollout_ref.rollout.val_kwargs.top_k=-1 actor_rollout_ref.rollout.val_kwargs.do_sample=true
  actor_rollout_ref.rollout.val_kwargs.n=1
  reward_model.reward_manager=dapo
  +reward_model.reward_kwargs.overlong_buffer_cfg.enable=true
  +reward_model.reward_kwargs.overlong_buffer_cfg.len=$(( max_response_length / 4 ))
  +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
  +reward_model.reward_kwargs.overlong_buffer_cfg.log=false
  +reward_model.reward_kwargs.max_resp_len=$max_response_length
  trainer.n_gpus_per_node=$gpus trainer.nnodes=1 trainer.logger=[console,file]
  trainer.project_name=dapo_long trainer.experiment_name=qwen2.5_${size}_${gpus}gpu
  trainer.default_local_dir=$RUN trainer.rollout_data_dir=$RUN/rollouts
  trainer.total_epochs=1 trainer.save_freq=20 trainer.test_freq=10 trainer.val_before_train=true
  "$@"
)
if [ "${HYBRIDRL_DRY_RUN:-0}" = 1 ]; then
  exec hybridrl config check "${args[@]}"
fi
[ -d "$MODEL" ] || hybridrl assets tiny-model "$MODEL" --size "qwen2.5-$size"
[ -f "$DATA/train.parquet" ] || hybridrl data make gsm8k-synthetic --out "$DATA" --train 7473 --test 1319 --seed 0
exec python -m hybridrl.trainer.main_ppo "${args[@]}"
