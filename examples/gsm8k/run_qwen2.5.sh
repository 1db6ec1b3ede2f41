#!/usr/bin/env bash
# GRPO or PPO on GSM8K-format parquet with a Qwen2.5-0.5B / 1.5B / 7B-sized model on 1, 2 or 8 GPUs —
# the shape of verl's examples/grpo_trainer/run_qwen2-7b.sh and examples/ppo_trainer/run_qwen2.5-0.5b.sh.
#
#   bash examples/gsm8k/run_qwen2.5.sh grpo 1.5b 2 [extra key=value overrides]
#
# MODEL: a local HF model directory (default: a random-weight model of that shape, made offline with
#        `hybridrl assets tiny-model DIR --size qwen2.5-SIZE`); DATA: a directory with train.parquet/test.parquet
#        in verl's GSM8K schema (default: `hybridrl data make gsm8k-synthetic`; verl's own gsm8k.py output works too).
# HYBRIDRL_DRY_RUN=1 only validates the config and prints the device layout.
# Long responses: append actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
# (Ulysses: each sequence of a training forward split over 2 GPUs; the actor's data-parallel size halves).
set -euo pipefail
algo=${1:?grpo or ppo}; size=${2:?0.5b, 1.5b or 7b}; gpus=${3:?1, 2 or 8}; shift 3
MODEL=${MODEL:-$HOME/models/qwen2.5-$size-random}
DATA=${DATA:-$HOME/data/gsm8k-synthetic}

case $size in  # tensor parallel for rollout, micro-batches, gradient checkpointing: what fits an 80-141 GB GPU
  0.5b) tp=1; micro=16; logprob_micro=32; ckpt=false ;;
  1.5b) tp=1; micro=8;  logprob_micro=32; ckpt=false ;;
  7b)   tp=$(( gpus >= 2 ? 2 : 1 )); micro=4; logprob_micro=16; ckpt=true ;;
  *) echo "size must be 0.5b, 1.5b or 7b, got $size" >&2; exit 2 ;;
esac
case $algo in
  grpo) algo_args=(algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.use_kl_loss=true
                   actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
                   data.train_batch_size=$(( 32 * gpus )) actor_rollout_ref.actor.ppo_mini_batch_size=$(( 16 * gpus ))) ;;
  ppo)  algo_args=(algorithm.adv_estimator=gae actor_rollout_ref.rollout.n=1 critic.optim.lr=1e-5
                   critic.ppo_micro_batch_size_per_gpu=$micro critic.model.enable_gradient_checkpointing=$ckpt
                   data.train_batch_size=$(( 128 * gpus )) actor_rollout_ref.actor.ppo_mini_batch_size=$(( 32 * gpus ))) ;;
  *) echo "algo must be grpo or ppo, got $algo" >&2; exit 2 ;;
esac

args=(
  data.train_files=$DATA/train.parquet data.val_files=$DATA/test.parquet
  data.max_prompt_length=512 data.max_response_length=1024
  actor_rollout_ref.model.path=$MODEL
  actor_rollout_ref.model.enable_gradient_checkpointing=$ckpt
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$micro
  actor_rollout_ref.rollout.tensor_model_parallel_size=$tp
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$logprob_micro
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$logprob_micro
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5
  trainer.n_gpus_per_node=$gpus trainer.nnodes=1
  trainer.logger=[console,file] trainer.project_name=hybridrl_gsm8k trainer.experiment_name=${algo}_qwen2.5_${size}_${gpus}gpu
  trainer.total_epochs=15 trainer.save_freq=20 trainer.test_freq=5
  "${algo_args[@]}" "$@"
)
if [ "${HYBRIDRL_DRY_RUN:-0}" = 1 ]; then
  exec hybridrl config check "${args[@]}"
fi
[ -d "$MODEL" ] || hybridrl assets tiny-model "$MODEL" --size "qwen2.5-$size"
[ -f "$DATA/train.parquet" ] || hybridrl data make gsm8k-synthetic --out "$DATA" --train 7473 --test 1319 --seed 0
exec python -m hybridrl.trainer.main_ppo "${args[@]}"
