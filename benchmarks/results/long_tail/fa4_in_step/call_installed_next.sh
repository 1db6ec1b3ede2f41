# Next GPU call (not run yet), after two stash calls (.fa4b, .fa4a; .gpu/fa4_bundle.sh): on one machine,
# 1. Liger's RoPE across packed lengths without the fa4 extra, with it, and with it pinned to Triton (rope_check.py);
# 2. the long-tail 1.5B at the defaults without the extra, with it (FA2, RoPE pinned by training/liger.py), and with
#    it under HYBRIDRL_FLASH=auto (FlashAttention-4), one run each: is the update back to 5.2-6.9 s, and what does
#    FlashAttention-4 do inside the step once RoPE no longer recompiles? The first run is the machine's first, on an
#    empty Triton cache: its step 1 generation against 24.0-25.5 s before the rollout kernels compiled 13 variants
#    instead of 35 (../fa4/lt_head_second_machine.json, ../defaults_h100_s55.json, on H100s).
source .gpu/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv > $OUT/device.csv
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
R=benchmarks/results/long_tail/fa4_in_step/rope_check.py
LT="python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --workdir /tmp/lt --defaults --gpus 1 --prompts 32 --n 8 --steps 3 --variants hybrid --repeat 1"
echo "== rope, no extra"; python $R
timeout 170 $LT --out $OUT/lt_no_extra.json > $OUT/lt_no_extra.log 2>&1; echo "no extra rc $? after $(el) s"
source /tmp/stash/install.sh || { echo "no stash"; exit 3; }
echo "== rope, extra"; python $R; echo "== rope, extra, pinned"; LIGER_KERNEL_IMPL_ROPE=nvidia-triton python $R
left=$(( 420 - $(el) )); timeout $left $LT --out $OUT/lt_extra_fa2.json > $OUT/lt_extra_fa2.log 2>&1; echo "extra fa2 rc $? after $(el) s"
left=$(( 585 - $(el) )); HYBRIDRL_FLASH=auto timeout $left $LT --out $OUT/lt_extra_fa4.json > $OUT/lt_extra_fa4.log 2>&1; echo "extra fa4 rc $? after $(el) s"
