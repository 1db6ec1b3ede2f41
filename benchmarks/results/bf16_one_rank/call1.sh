#!/usr/bin/env bash
# Device call 1 (fresh H200): the chunked head by variant (entropy detached, chunk sizes, GEMM floor), its GPU
# tests, the 7B shape and prompts, then TRL full fine-tuning (bf16 weights) run 1 and hybridrl bf16 masters run 1
# (gradients reduced in bf16 at one rank, so reduced once per mini-batch)
set -u
source benchmarks/results/rows_on_host/prep7b.sh
timeout 120 python benchmarks/fused_head.py --out $OUT/fused_head.json > $OUT/fused_head.log 2>&1
echo "fused_head rc=$? t=$SECONDS"; grep "^\[fused_head\]" $OUT/fused_head.log | cut -c1-260
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/training/test_fused_logprob.py \
   tests/training/test_update_sync_gpu.py > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc=$? t=$SECONDS"; tail -2 $OUT/gpu_tests.log
source benchmarks/results/bf16_one_rank/trl_run.sh 1
source benchmarks/results/bf16_one_rank/bf16_run.sh 1
