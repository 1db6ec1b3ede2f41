# session 60 (2026-12-06): the long-tail 1.5B at the defaults with FlashAttention-4 installed (then taken under
# HYBRIDRL_FLASH=auto, the default of that tree), three runs in one call; once on an H100, once on an H200.
# Before it, two calls stashed the fa4 extra's wheels and libraries (carry .fa4b, then .fa4a; .gpu/fa4_bundle.sh).
source .gpu/setup.sh
source /tmp/stash/install.sh
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
LT="python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --workdir /tmp/lt --defaults --gpus 1 --prompts 32 --n 8 --steps 3 --variants hybrid --repeat 1"
for run in 1 2 3; do
left=$(( 585 - $(el) )); [ $left -lt 130 ] && { echo "no time for run $run"; break; }
timeout $left $LT --out $OUT/lt_fa4_run$run.json > $OUT/lt_fa4_run$run.log 2>&1; echo "run $run rc $? after $(el) s"
done
