#!/usr/bin/env bash
# Device call 2 (warm, after call 1): TRL run 2, hybridrl bf16 masters runs 2 and 3
set -u
source benchmarks/results/rows_on_host/prep7b.sh
source benchmarks/results/bf16_one_rank/trl_run.sh 2
source benchmarks/results/bf16_one_rank/bf16_run.sh 2
source benchmarks/results/bf16_one_rank/bf16_run.sh 3
