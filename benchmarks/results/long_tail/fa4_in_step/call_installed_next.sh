# session 60: does having FlashAttention-4's packages installed slow the in-step update with FlashAttention-2?
# after two stash calls (.fa4b, .fa4a). A: no FA4 packages; B: FA4 installed, HYBRIDRL_FLASH=fa2. Same machine.
source .gpu/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv > $OUT/device.csv; cat $OUT/device.csv
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
LT="python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --workdir /tmp/lt --defaults --gpus 1 --prompts 32 --n 8 --steps 3 --variants hybrid --repeat 1"
show() { python - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for v in d["variants"].values():
    for s in v["per_step"]:
        print({k: round(s.get(k, -1), 2) for k in ("timing_s/step", "timing_s/gen", "timing_s/update_actor",
               "memory/update_actor/alloc_retries", "memory/update_actor/peak_reserved_gb")})
PY
}
timeout 140 $LT --out $OUT/lt_no_fa4.json > $OUT/lt_no_fa4.log 2>&1; echo "A rc $? after $(el) s"; show $OUT/lt_no_fa4.json
source /tmp/stash/install.sh || echo "no FA4 (no stash)"
left=$(( 285 - $(el) )); HYBRIDRL_FLASH=fa2 timeout $left $LT --out $OUT/lt_fa4_installed_fa2.json > $OUT/lt_fa4_installed_fa2.log 2>&1; echo "B rc $? after $(el) s"; show $OUT/lt_fa4_installed_fa2.json
