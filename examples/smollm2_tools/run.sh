#!/usr/bin/env bash
# SmolLM2-135M-Instruct learns to use a calculator, one GPU, one command: an SFT warm-up on tool-call traces, then
# multi-turn GRPO on big-integer products (the bignum task) with the calculator running inside the rollout.
#
#   bash examples/smollm2_tools/run.sh [extra key=value overrides for the GRPO stage]
#
# SmolLM2's own chat template renders neither tools= nor tool calls, and a 135M model does not call tools unprompted:
# chat_template.jinja is SmolLM2's ChatML with Qwen2.5's Hermes tool rendering (tools in <tools></tools> in the
# system message, calls as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, answers as a user turn of
# <tool_response> blocks); both stages use it (model.custom_chat_template, actor_rollout_ref.model.custom_chat_template)
# and the SFT conversations are laid out token for token as the multi-turn rollout lays out a trajectory.
# 1. MODEL: converted as in examples/smollm2_arith if missing. DATA: `hybridrl data make bignum`, 2000 train / 128
#    validation questions, operands of 6-9 digits (products of 11-18 digits: without the tool accuracy is ~0).
# 2. SFT (skipped if SFT/huggingface/model.safetensors exists): make_sft_data.py turns the first SFT_ROWS (64)
#    train questions into conversations (assistant calls the calculator on the expression, a tool message with the
#    calculator's real answer, assistant '#### N') and `hybridrl sft data.multiturn.enable=true` trains on them
#    for one epoch (2 steps of 32, lr 1e-4, loss on the assistant's tokens only: tool answers are attended, not
#    trained). Weak on purpose, so GRPO has something to improve. Calibrated on CPU with first_turn_tool_use.py (64
#    test prompts, one sampled first turn each, bf16 weights and compute as the GPU rollout runs, the SFT computing
#    in bf16 as on a GPU; benchmarks/results/smollm2_tools_sft_calibration/): the base model never calls the tool;
#    64 rows at 1e-4 open a call in 59% of first turns with the right expression in 39%; at 2e-4 100% / 89%;
#    128 rows at 1e-4 100% / 95%. At 5e-5 the warm-up does not survive bf16 (11% open, 0% right; in fp32 it read
#    81% / 66%). SFT_ROWS and SFT_ARGS="optim.lr=2e-4" (overrides) change it.
# 3. GRPO from SFT/huggingface with examples/smollm2_arith/run.sh's settings (64 prompts x 8 at T=0.8, lr 1e-5,
#    no KL) for 30 steps, multi_turn.enable=true with the calculator (examples/multiturn_calculator/tool_config.yaml;
#    a turn ends at its first </tool_call>, at most 3 assistant turns), prompts up to 384 tokens (the tools' system
#    message), responses up to 256 (model and tool tokens; tool tokens are out of the loss). Reward: the bignum
#    scorer (the last '#### N' in the model's own tokens must be the exact product). Validation (sampled, T=0.8)
#    before training and every 10 steps: val-core/bignum/acc/mean@1 the accuracy, val-aux/multi_turn/tool_use_rate
#    the fraction of trajectories with at least one tool call, val-aux/tool_call_counts/mean, val-aux/num_turns/mean;
#    per step the same without val-aux/ (multi_turn/tool_use_rate, tool_call_counts/mean, multi_turn/tool_errors...).
# On one H200: 18 s a GRPO step (docs/benchmarks.md §0f: 20 steps took validation accuracy 0.28 -> 0.99).
# HYBRIDRL_DRY_RUN=1 only validates the GRPO config and prints the device layout (the SFT model need not exist).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=${MODEL:-$HOME/models/smollm2-135m-instruct}
DATA=${DATA:-$HOME/data/smollm2_bignum}
SFT=${SFT:-$HOME/models/smollm2-135m-tools-sft}
TOOLS=$here/../multiturn_calculator/tool_config.yaml
TEMPLATE=$here/chat_template.jinja
mt=actor_rollout_ref.rollout.multi_turn
args=(  # over examples/smollm2_arith/run.sh's GRPO settings
  data.max_prompt_length=384 data.max_response_length=256
  custom_reward_function.path=null  # data_source bignum: the bignum scorer
  actor_rollout_ref.model.custom_chat_template=$TEMPLATE
  $mt.enable=true $mt.tool_config_path=$TOOLS $mt.format=hermes $mt.max_assistant_turns=3 $mt.max_parallel_calls=1
  trainer.total_epochs=1 trainer.total_training_steps=30 trainer.experiment_name=grpo_bignum_tools
  "$@"
)
if [ "${HYBRIDRL_DRY_RUN:-0}" != 1 ]; then
  [ -f "$MODEL/model.safetensors" ] || hybridrl assets smollm2 "$MODEL" ${GGUF:+--gguf "$GGUF"}
  [ -f "$DATA/train.parquet" ] ||
    hybridrl data make bignum --out "$DATA" --train 2000 --test 128 --seed 0 --min-digits 6 --max-digits 9
  if [ ! -f "$SFT/huggingface/model.safetensors" ]; then
    python "$here/make_sft_data.py" --data "$DATA/train.parquet" --tools "$TOOLS" \
      --out "$DATA/sft_tool_calls.parquet" --rows "${SFT_ROWS:-64}"
    # shellcheck disable=SC2086  # SFT_ARGS: overrides split on spaces
    hybridrl sft data.train_files="$DATA/sft_tool_calls.parquet" data.multiturn.enable=true \
      model.partial_pretrain="$MODEL" model.custom_chat_template="$TEMPLATE" \
      data.max_length=640 data.train_batch_size=32 data.micro_batch_size_per_gpu=16 \
      optim.lr=1e-4 optim.warmup_steps_ratio=0.1 trainer.total_epochs=1 trainer.project_name=hybridrl_smollm2 \
      trainer.experiment_name=sft_bignum_tools trainer.default_local_dir="$SFT" ${SFT_ARGS:-}
  fi
fi
MODEL=$SFT/huggingface DATA=$DATA exec bash "$here/../smollm2_arith/run.sh" "${args[@]}"
