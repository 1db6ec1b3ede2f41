# session 60: is the slow in-step update with FlashAttention-4 installed the allocator's cache-flushing retries?
# after two stash calls (.fa4b, .fa4a). A: FA4 installed, defaults; B: the same with expandable segments.
source .gpu/setup.sh
source /tmp/stash/install.sh || echo "no FA4 (no stash): FA2"
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv > $OUT/device.csv; cat $OUT/device.csv
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
timeout 60 python -m pytest -q -m gpu tests/hybrid/test_phase_memory.py 2>&1 | tail -2
LT="python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --workdir /tmp/lt --defaults --gpus 1 --prompts 32 --n 8 --steps 3 --variants hybrid --repeat 1"
show() { python - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for v in d["variants"].values():
    for s in v["per_step"]:
        print({k: round(s.get(k, -1), 2) for k in ("timing_s/step", "timing_s/gen", "timing_s/update_actor",
               "memory/update_actor/alloc_retries", "memory/gen/alloc_retries", "memory/update_actor/peak_allocated_gb",
               "memory/update_actor/peak_reserved_gb")})
PY
}
left=$(( 440 - $(el) )); timeout $left $LT --out $OUT/lt_retries_a.json > $OUT/lt_retries_a.log 2>&1; echo "A rc $? after $(el) s"; show $OUT/lt_retries_a.json
left=$(( 440 - $(el) )); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $left $LT --out $OUT/lt_retries_b.json > $OUT/lt_retries_b.log 2>&1; echo "B rc $? after $(el) s"; show $OUT/lt_retries_b.json
grep -v "UserWarning\|JitArgument" $OUT/lt_retries_b.log | grep -i "error\|Traceback" | head -5
