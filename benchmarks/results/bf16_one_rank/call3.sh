#!/usr/bin/env bash
# Device call 3 (warm, after call 2): TRL run 3, then hybridrl at the defaults (fp32 masters) once
set -u
source benchmarks/results/rows_on_host/prep7b.sh
source benchmarks/results/bf16_one_rank/trl_run.sh 3
timeout $((590-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 \
   --workdir $W --variants full --out $OUT/hybridrl_qwen2.5-7b_full_fp32.json > $OUT/hybridrl_7b_full_fp32.log 2>&1
echo "fp32 rc=$? t=$SECONDS"; grep -E "^\[bench\]|^step" $OUT/hybridrl_7b_full_fp32.log | cut -c1-330
