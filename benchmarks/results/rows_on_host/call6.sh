#!/usr/bin/env bash
# Device call 6 (warm machine of call 5, without the 7B weights): bf16 masters with the gradient reduction
# deferred only where it costs no memory (not with bf16 masters + fp32 reduce_dtype), then a second fp32 run
set -u
source benchmarks/results/rows_on_host/prep7b.sh
timeout $((290-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 \
   --workdir $W --variants "bf16:actor_rollout_ref.actor.fsdp_config.model_dtype=bf16" \
   --out $OUT/hybridrl_qwen2.5-7b_full_bf16_run2.json > $OUT/hybridrl_7b_full_bf16_run2.log 2>&1
echo "bf16 rc=$? t=$SECONDS"; grep -E "^\[bench\]|^step" $OUT/hybridrl_7b_full_bf16_run2.log | cut -c1-330
timeout $((425-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 \
   --workdir $W --variants full --out $OUT/hybridrl_qwen2.5-7b_full_run2.json > $OUT/hybridrl_7b_full_run2.log 2>&1
echo "full rc=$? t=$SECONDS"; grep -E "^\[bench\]|^step" $OUT/hybridrl_7b_full_run2.log | cut -c1-330
