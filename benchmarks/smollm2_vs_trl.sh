#!/usr/bin/env bash
# The real-model task side by side with TRL's GRPOTrainer, one GPU: SmolLM2-135M-Instruct learns "What is a + b?"
# (examples/smollm2_arith: 64 prompts x 8 at T=0.8, lr 1e-5, 128 new tokens, one optimizer step per rollout, no KL,
# last-integer reward, gradient checkpointing on both sides), sampled validation accuracy (T=0.8, 200 questions)
# at step 0 and every 10 steps, STEPS steps. Each side writes its own files under OUT, so the sides can run in
# separate device calls:
#   SIDE=hybridrl: OUT/hybridrl_metrics.jsonl (verl metrics per step) + OUT/hybridrl_run.log
#   SIDE=trl:      OUT/trl.json (benchmarks/trl_grpo.py: step times, peak memory, val_curve)
# then `python benchmarks/summarize_smollm2.py OUT` (curves by step and by wall time, plot).
#
#   source .gpu/setup.sh && MODEL=/tmp/smollm2 SIDE=hybridrl bash benchmarks/smollm2_vs_trl.sh $OUT [k=v ...]
# MODEL must exist (hybridrl assets smollm2 DIR); DATA is made if missing. Extra arguments go to hybridrl's run.
set -euo pipefail
OUT=${1:?usage: smollm2_vs_trl.sh OUT [overrides]}; shift
SIDE=${SIDE:?SIDE=hybridrl or SIDE=trl}; STEPS=${STEPS:-60}; MODEL=${MODEL:?MODEL=dir}; DATA=${DATA:-/tmp/smollm2_add}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.csv" || true
[ -f "$DATA/train.parquet" ] || python examples/smollm2_arith/make_data.py --out "$DATA" --train 3000 --test 200 --seed 0
if [ "$SIDE" = hybridrl ]; then
  log=$OUT/hybridrl_metrics.jsonl; rm -f "$log"
  VERL_FILE_LOGGER_PATH=$log MODEL=$MODEL DATA=$DATA bash examples/smollm2_arith/run.sh \
    trainer.total_training_steps="$STEPS" \
    trainer.default_local_dir=/tmp/smollm2_run "$@" 2>&1 | tee "$OUT/hybridrl_run.log" | grep -E "val-core|Error|error" || true
else
  python benchmarks/trl_grpo.py --model "$MODEL" --prompts "$DATA/train.parquet" --val-prompts "$DATA/test.parquet" \
    --val-every 10 --steps $((STEPS - 1)) --batch-prompts 64 --n 8 --micro-batch 8 --max-prompt-len 128 \
    --max-new-tokens 128 --lr 1e-5 --temperature 0.8 --val-temperature 0.8 --weights fp32 --gradient-checkpointing \
    --reward last_int --out "$OUT/trl.json" 2>&1 | grep -E "^\[trl\]|Error|^\{\"trl" || true
fi
