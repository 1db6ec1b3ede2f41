# session 59 plan, call 2 (after a call 1 carrying .fa4b: mkdir -p /tmp/stash && cp .fa4b/* /tmp/stash/), carry
# [".gpu", ".fa4a"]: the GPU tests at this tree (the fused decode MLP in the engine: never run end to end on a GPU),
# then the long tail with the fused MLP on / off, FA4 installed (so both run with it)
source .gpu/setup.sh
source .fa4a/install.sh || echo "no FA4 (no stash): both variants run FA2"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/rollout tests/training > $OUT/gpu_tests.log 2>&1; echo "pytest rc $? after $(el) s"
tail -4 $OUT/gpu_tests.log
LT="python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --workdir /tmp/lt --defaults --gpus 1 --prompts 32 --n 8 --steps 3 --variants hybrid --repeat 1"
for mode in 1 0; do
left=$(( 590 - $(el) )); [ $left -lt 110 ] && { echo "no time for fused_mlp=$mode"; break; }
HYBRIDRL_FUSED_MLP=$mode timeout $left $LT --out $OUT/lt_fused_mlp_$mode.json > $OUT/lt_fused_mlp_$mode.log 2>&1; echo "lt fused_mlp=$mode rc $? after $(el) s"
python .gpu/s58/show_lt.py $OUT/lt_fused_mlp_$mode.json 2>&1 | tail -4
done
