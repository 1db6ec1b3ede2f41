# session 58 (little device time): the long tail at HEAD, 2 steps (session 56's step-2 update on the same sampled
# lengths: 6.27 / 6.41 s; session 58's first machine: 9.32 s), then the fused decode MLP experiment
source .gpu/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv > $OUT/device.csv
cat $OUT/device.csv
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active,utilization.gpu --format=csv,noheader -l 2 > $OUT/smi.csv 2>&1 &
SMI=$!
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
ARGS="--preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --defaults --gpus 1 --prompts 32 --n 8 --steps 2 --variants hybrid --repeat 1"
timeout 170 python benchmarks/long_tail.py $ARGS --workdir /tmp/lt --out $OUT/lt_head.json > $OUT/lt_head.log 2>&1; echo "head rc $? after $(el) s"
python .gpu/s57/show_lt.py $OUT/lt_head.json 2>&1 | tail -3
left=$(( 400 - $(el) ))
[ $left -gt 40 ] && { timeout $left python benchmarks/decode_fused_mlp.py --model 1.5B --rows 8,1 --out $OUT/decode_fused_mlp.json > $OUT/decode_fused_mlp.log 2>&1; echo "fused mlp rc $? after $(el) s"; tail -4 $OUT/decode_fused_mlp.log | cut -c1-600; }
kill $SMI 2>/dev/null
awk -F, '$6+0 > 50' $OUT/smi.csv | awk 'NR % 10 == 1' | head -12
