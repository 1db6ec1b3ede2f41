#!/usr/bin/env bash
# GRPO rewarded by a learned reward model instead of the rule, one GPU, one command: SmolLM2-135M-Instruct on the
# a + b task of examples/smollm2_arith, trained on the score of a reward model that never sees the answer key.
#
#   bash examples/smollm2_reward_model/run.sh [extra key=value overrides]
#
# 1. MODEL and DATA as in examples/smollm2_arith (converted / made if missing).
# 2. RM (skipped if RM/model.safetensors exists): train_rm.py fine-tunes SmolLM2 itself into a reward model
#    (ForSequenceClassification, one score) on 1024 questions x 4 answers sampled from the policy at T=0.8 plus,
#    for 2 of them each, a copy with the right sum and one with a near miss, labelled by the rule (last integer =
#    sum); RM/rm_eval.json holds its held-out (20% of the questions) accuracy and ROC AUC. RM_ARGS="--epochs 3"
#    passes options to it.
# 3. GRPO exactly as examples/smollm2_arith/run.sh (64 prompts x 8, T=0.8, lr 1e-5, 60 steps, validation every 10)
#    with reward_model.enable=true style=model: the reward is the reward model's score at the last response token
#    (it reads the policy's own token ids: same tokenizer and chat template). reward.py passes that score through
#    unchanged and only reports the rule, so validation's val-core/smollm2_add/acc/mean@1 is still the rule
#    accuracy (the arith recipe's key) and val-aux/smollm2_add/reward/mean@1 the reward model's mean score.
#    Per step: reward_model/score/mean (= critic/score/mean), timing_s/reward.
# Measured on one H200 (docs/benchmarks.md §0e): the reward model reached held-out AUC 0.78 (0.69 on the policy's
# own samples); optimizing its score raised the rule accuracy 0.06 -> 0.30 by step 30, then the policy found what
# the model over-scores and it fell to 0.115 at step 40 while the score kept rising (the rule-rewarded run: 0.06 ->
# 0.735 at step 40). Watch val-core acc and stop early, or train a stronger reward model.
# HYBRIDRL_DRY_RUN=1 only validates the config and prints the device layout (with the policy standing in for a
# reward model not trained yet: the same tokenizer and size).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export MODEL=${MODEL:-$HOME/models/smollm2-135m-instruct}
export DATA=${DATA:-$HOME/data/smollm2_add}
RM=${RM:-$HOME/models/smollm2-135m-add-rm}
if [ "${HYBRIDRL_DRY_RUN:-0}" = 1 ] && [ ! -d "$RM" ]; then  # the reward model is made from the policy: same size
  echo "dry run: no reward model at $RM yet; checking with the policy $MODEL in its place" >&2
  RM=$MODEL stand_in=(+reward_model.model.override_config.num_labels=1)
fi
args=(
  reward_model.enable=true reward_model.style=model reward_model.model.path=$RM
  custom_reward_function.path=$here/reward.py custom_reward_function.name=compute_score
  trainer.experiment_name=grpo_add_reward_model
  ${stand_in[@]+"${stand_in[@]}"} "$@"
)
if [ "${HYBRIDRL_DRY_RUN:-0}" != 1 ]; then
  [ -f "$MODEL/model.safetensors" ] || hybridrl assets smollm2 "$MODEL" ${GGUF:+--gguf "$GGUF"}
  [ -f "$DATA/train.parquet" ] || python "$here/../smollm2_arith/make_data.py" --out "$DATA" --train 3000 --test 200 --seed 0
  # shellcheck disable=SC2086  # RM_ARGS: options split on spaces
  [ -f "$RM/model.safetensors" ] || python "$here/train_rm.py" --policy "$MODEL" --data "$DATA" --out "$RM" ${RM_ARGS:-}
fi
exec bash "$here/../smollm2_arith/run.sh" "${args[@]}"
