#!/usr/bin/env bash
# The GPU benchmark suite as run through the device tool (2 × H200). Usage: benchmarks/gpu_suite.sh PART OUTDIR
#   part 1: CUDA smoke (tiny model, 1 step) + Qwen2.5-1.5B: hybrid vs scheme A, TP sweep, offload
#   part 2: Qwen2.5-7B: hybrid vs scheme A
set -uo pipefail
part=$1; out=$2
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false
common="--prompts 64 --n 8 --prompt-len 256 --response-len 256 --gpus 2 --tp 2"
if [ "$part" = 1 ]; then
  python -m hybridrl.cli assets tiny-model /tmp/tiny --layers 2 --hidden 64 >/dev/null &&
  python benchmarks/grpo_step.py --preset dir:/tmp/tiny --gpus 2 --tp 2 --prompts 8 --n 4 --prompt-len 32 \
      --response-len 16 --steps 2 --micro 4 --logprob-micro 8 --variants hybrid --out "$out/smoke.json" || exit 1
  python benchmarks/grpo_step.py --preset qwen2.5-1.5b $common --steps 3 --micro 8 --logprob-micro 16 \
      --variants "hybrid,scheme_a,hybrid_tp1:actor_rollout_ref.rollout.tensor_model_parallel_size=1,hybrid_offload:actor_rollout_ref.actor.fsdp_config.param_offload=true;actor_rollout_ref.actor.fsdp_config.optimizer_offload=true" \
      --out "$out/grpo_qwen2.5-1.5b.json"
elif [ "$part" = 2 ]; then
  python benchmarks/grpo_step.py --preset qwen2.5-7b $common --steps 3 --micro 4 --logprob-micro 16 --grad-ckpt \
      --variants hybrid,scheme_a --out "$out/grpo_qwen2.5-7b.json"
fi
