# issue 31: speculation on vs off on SmolLM2 a + b with a 1,024-token limit (the rollout alone): the verify step's
# indices sent from pinned memory (this tree), then the same with the previous spec_verify.py (pageable copies)
source .gpu/setup.sh
export PYTHONPATH=/tmp/real-model/site:$PYTHONPATH
start=$(date +%s)
python -m hybridrl.cli assets smollm2 /tmp/smol --gguf /tmp/real-model/SmolLM2-135M-Instruct.Q4_1.gguf 2>&1 | tail -1
python examples/smollm2_arith/make_data.py --out /tmp/smol_data --train 3000 --test 200 --seed 0 | tail -1
echo "model + data after $(( $(date +%s) - start )) s"
args="--model /tmp/smol --prompts /tmp/smol_data/train.parquet --num-prompts 64 --n 8 --max-tokens 1024 --temperature 0.8 --repeat 3"
timeout 150 python benchmarks/spec_decode.py $args --out $OUT/spec_decode_smollm2_long_pinned.json > $OUT/spec_pinned.log 2>&1
echo "pinned rc=$? after $(( $(date +%s) - start )) s"; tail -3 $OUT/spec_pinned.log
cp .gpu/spec_verify_before.py hybridrl/rollout/spec_verify.py
timeout 150 python benchmarks/spec_decode.py $args --out $OUT/spec_decode_smollm2_long_pageable.json > $OUT/spec_pageable.log 2>&1
echo "pageable rc=$? after $(( $(date +%s) - start )) s"; tail -3 $OUT/spec_pageable.log
