#!/usr/bin/env bash
# hybridrl at its defaults vs TRL's GRPOTrainer, side by side in one device call, on one GPU:
# GRPO, random-weight Qwen2.5 shape, 64 prompts x n=8, 256 prompt + 256 generated tokens (EOS ignored),
# gradient checkpointing on both, no KL. hybridrl: verl keys only (the run plan picks micro-batches and the KV
# cache), fp32 masters (its default) and bf16 masters; TRL: bf16 weights (its memory-lean mode) and fp32 weights
# with bf16 autocast. Each configuration runs REPEAT times; JSON per run under OUT.
#
#   source .gpu/setup.sh && bash benchmarks/vs_trl.sh qwen2.5-0.5b 3 $OUT
# (PARTS=hybridrl or PARTS=trl runs one side, for calls split by the device's time limit; STEPS includes 1 warm-up)
set -euo pipefail
PRESET=${1:-qwen2.5-0.5b}; REPEAT=${2:-3}; OUT=${3:-/tmp/vs_trl}; STEPS=${STEPS:-4}; PARTS=${PARTS:-hybridrl,trl}
WORK=/tmp/hybridrl_bench; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.csv" || true
[[ $PARTS == *hybridrl* ]] && python benchmarks/grpo_step.py --preset "$PRESET" --gpus 1 --defaults --grad-ckpt --steps "$STEPS" \
  --repeat "$REPEAT" --workdir "$WORK" \
  --variants "hybrid,hybrid_bf16:actor_rollout_ref.actor.fsdp_config.model_dtype=bf16" \
  --out "$OUT/hybridrl_${PRESET}.json" 2>&1 | grep -E "^\[bench\]|auto:|kv cache|Error" || true
[[ $PARTS == *trl* ]] || exit 0
if [[ ! -f $WORK/models/$PRESET/config.json ]]; then  # the same random weights grpo_step.py writes
  python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$WORK/models/$PRESET', '$PRESET', weights=True)"
fi
if ! ls "$WORK"/data/prompts_*x256.parquet >/dev/null 2>&1; then
  python -c "from pathlib import Path; import sys; sys.path.insert(0, 'benchmarks'); from grpo_step import make_prompts as m; m(Path('$WORK/data'), Path('$WORK/models/$PRESET'), 256, 256)"
fi
DATA=$(ls "$WORK"/data/prompts_*x256.parquet | head -1)
for w in bf16 fp32; do
  for i in $(seq 1 "$REPEAT"); do
    python benchmarks/trl_grpo.py --model "$WORK/models/$PRESET" --prompts "$DATA" --steps $((STEPS - 1)) \
      --batch-prompts 64 --n 8 --max-prompt-len 256 --max-new-tokens 256 --weights $w --gradient-checkpointing \
      --ignore-eos --reward last_int --out "$OUT/trl_${PRESET}_${w}_$i.json" 2>&1 | tail -2 || true
  done
done
