#!/usr/bin/env bash
# Device call 2: the GPU tests of host-resident rows (sync test), the in-GEMM head gradient (test + fused_head.py),
# then one 7B GRPO run each at the defaults (fp32 masters) and with bf16 masters
set -u
source benchmarks/results/rows_on_host/prep7b.sh
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/training/test_update_sync_gpu.py \
   tests/training/test_gpu_packing.py tests/training/test_fused_logprob.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? t=$SECONDS"; tail -3 $OUT/gpu_tests.log
timeout 120 python benchmarks/fused_head.py --out $OUT/fused_head.json > $OUT/fused_head.log 2>&1
echo "fused_head rc=$? t=$SECONDS"; grep fused_head $OUT/fused_head.log | cut -c1-300
timeout $((440-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 \
   --workdir $W --variants full --out $OUT/hybridrl_qwen2.5-7b_full_run1.json > $OUT/hybridrl_7b_full_run1.log 2>&1
echo "full rc=$? t=$SECONDS"; grep -E "^\[bench\]|^step" $OUT/hybridrl_7b_full_run1.log | cut -c1-330
timeout $((595-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 \
   --workdir $W --variants "bf16:actor_rollout_ref.actor.fsdp_config.model_dtype=bf16" \
   --out $OUT/hybridrl_qwen2.5-7b_full_bf16_run1.json > $OUT/hybridrl_7b_full_bf16_run1.log 2>&1
echo "bf16 rc=$? t=$SECONDS"; grep -E "^\[bench\]|^step" $OUT/hybridrl_7b_full_bf16_run1.log | cut -c1-330
