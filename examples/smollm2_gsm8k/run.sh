#!/usr/bin/env bash
# A harder real-model task, one GPU, one command: SmolLM2-135M-Instruct on multi-step word problems in GSM8K's
# format (`hybridrl data make gsm8k-synthetic`: verl's GSM8K rows, data_source openai/gsm8k, the instruction
# 'output the final answer after "####"'), rewarded by verl's own GSM8K scorer (strict: only a "#### N" line counts,
# so the model must learn the format as well as the arithmetic).
#
#   bash examples/smollm2_gsm8k/run.sh [extra key=value overrides]
#
# The same run as examples/smollm2_arith (64 prompts x 8 at T=0.8, lr 1e-5, one optimizer step per rollout, no KL,
# sampled validation every 10 steps) with 256-token prompts and responses and verl's default reward instead of
# the last-integer one. MODEL as there; DATA (3000 train / 200 test problems, seed 0) made if missing.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA=${DATA:-$HOME/data/smollm2_gsm8k}
if [ "${HYBRIDRL_DRY_RUN:-0}" != 1 ] && [ ! -f "$DATA/train.parquet" ]; then
  hybridrl data make gsm8k-synthetic --out "$DATA" --train 3000 --test 200 --seed 0
fi
DATA=$DATA exec bash "$here/../smollm2_arith/run.sh" \
  data.max_prompt_length=256 data.max_response_length=256 \
  custom_reward_function.path=null \
  trainer.experiment_name=grpo_gsm8k_synthetic "$@"
