#!/usr/bin/env bash
# SmolLM2-135M-Instruct learns "What is a + b?" (a, b in 1..60) with feedback, one GPU, one command: the multi-turn
# sibling of examples/smollm2_arith. A simulated user (verl's interaction system: interaction_config.yaml,
# feedback.py) reads each answer's last integer; a wrong one gets "Your answer is incorrect. Add the two numbers
# again and end your reply with the sum." as a user message and the model answers again, at most twice
# (multi_turn.max_user_turns=2: at most 3 assistant turns); a right one ends the trajectory.
#
#   bash examples/smollm2_interaction/run.sh [extra key=value overrides]
#
# MODEL: converted as in examples/smollm2_arith if missing (GGUF=FILE converts a local GGUF).
# DATA:  made if missing by examples/smollm2_arith/make_data.py --interaction add (the same 3000 train / 200
#        validation questions, seed 0, each row with extra_info.interaction_kwargs = {"name": "add",
#        "ground_truth": "a+b"}: the sample selects the interaction).
# Reward (examples/smollm2_arith/reward.py): 1.0 when the last integer of the model's own tokens (the last assistant
# turn's; the feedback messages are out of the scored text and out of the loss) is a + b, else 0.0 — so a
# trajectory right at its first try and one right after a retry score the same. The interaction's per-turn scores
# (1.0 right / 0.0 wrong) are not the reward: they are in each sample's multi_turn_stats.turn_scores; the last
# answer of a trajectory cut by the turn limit is judged by the reward alone.
# examples/smollm2_arith/run.sh's GRPO settings (64 prompts x 8 at T=0.8, lr 1e-5, no KL, sampled validation
# before training and every 10 steps) with 128-token prompts and 256-token responses (all turns plus the feedback
# messages, 28 tokens each with SmolLM2's tokenizer); 40 steps by default (the scenario smollm2-interaction: 20).
# Per step: num_turns/mean (verl's count: assistant + user turns + 1; 2 = right at the first try),
# multi_turn/cut_by_turns (used both retries: the limit ends the trajectory before the interaction sees the third
# answer); val-aux/ the same for validation.
# HYBRIDRL_DRY_RUN=1 only validates the config and prints the device layout.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=${MODEL:-$HOME/models/smollm2-135m-instruct}
DATA=${DATA:-$HOME/data/smollm2_add_interaction}
mt=actor_rollout_ref.rollout.multi_turn
args=(  # over examples/smollm2_arith/run.sh's settings
  data.max_prompt_length=128 data.max_response_length=256
  $mt.enable=true $mt.interaction_config_path=$here/interaction_config.yaml
  $mt.max_user_turns=2 $mt.max_assistant_turns=3
  trainer.total_epochs=1 trainer.total_training_steps=40 trainer.experiment_name=grpo_add_interaction
  "$@"
)
if [ "${HYBRIDRL_DRY_RUN:-0}" != 1 ] && [ ! -f "$DATA/train.parquet" ]; then
  python "$here/../smollm2_arith/make_data.py" --out "$DATA" --train 3000 --test 200 --seed 0 --interaction add
fi
MODEL=$MODEL DATA=$DATA exec bash "$here/../smollm2_arith/run.sh" "${args[@]}"
