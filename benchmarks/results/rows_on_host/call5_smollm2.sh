#!/usr/bin/env bash
# Device call 5 (after .real/a and .real/b landed on the same warm machine): the real-model task at the defaults
# of this commit (Liger, shared-prompt forwards, host-resident rows, in-GEMM head gradient, gradient reduction in
# the last backward on one GPU): examples/smollm2_arith through benchmarks/smollm2_vs_trl.sh, 60 steps
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:/tmp/real-model/site:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p /tmp/site/bin; command -v hybridrl >/dev/null || { printf '#!/bin/sh\nexec python -m hybridrl.cli "$@"\n' > /tmp/site/bin/hybridrl; chmod +x /tmp/site/bin/hybridrl; }
python -m hybridrl.cli assets smollm2 /tmp/smollm2 --gguf /tmp/real-model/SmolLM2-135M-Instruct.Q4_1.gguf > $OUT/convert.log 2>&1
echo "convert rc=$? t=$SECONDS"; tail -2 $OUT/convert.log
MODEL=/tmp/smollm2 SIDE=hybridrl timeout $((590-SECONDS)) bash benchmarks/smollm2_vs_trl.sh $OUT
echo "run rc=$? t=$SECONDS"; grep -E "auto:" $OUT/hybridrl_run.log | cut -c1-200 | head; tail -2 $OUT/hybridrl_run.log | cut -c1-300
