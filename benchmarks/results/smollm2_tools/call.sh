# issue 19: after .real/a was landed in a previous call on this warm machine: land .real/b, then gpu_suite 13 (tool-use curve)
set -u
bash .real/b/land.sh > $OUT/land.log 2>&1 || { cat $OUT/land.log; exit 1; }
source gpu_calls/common.sh
export PYTHONUNBUFFERED=1
timeout $((590-SECONDS)) bash benchmarks/gpu_suite.sh 13 $OUT > $OUT/part13.log 2>&1; echo "part13 rc=$? t=$SECONDS"
grep -hE "val-core|tool_use_rate|step 1 |sft" $OUT/smollm2_tools.log | cut -c1-250 | tail -15
