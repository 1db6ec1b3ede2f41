# session 59 call C (no FA4 stash): the engine's graph decode step at 24 / 32 rows with the fused MLP taken up to 32
# rows, on / off; then a long tail where the fused MLP runs (8 prompts x 8: the tail falls below 16 rows), on / off
source .gpu/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for rows in 24 32; do for m in 1 0; do
HYBRIDRL_FUSED_MLP=$m timeout 90 python benchmarks/profile_decode.py --model 1.5B --batch $rows --prompt-len 1024 --new-tokens 256 --fused-mlp-max-rows 32 --out $OUT/pd_b${rows}_mlp$m.json > /dev/null 2>$OUT/pd_err.log
echo "pd rows=$rows mlp=$m rc $? after $(el) s"
python - $OUT/pd_b${rows}_mlp$m.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]));e=d["eager_profile"]
print(" graph ms/step %.3f  eager kernel ms/step %.3f  byte floor ms %.3f" % (d["graph_decode_ms_per_step"], e["kernel_ms_per_step"], d["byte_floor"]["byte_floor_ms"]))
for k,v in e["top_kernels_ms_per_step"][:4]: print("   %.4f %s" % (v, k[:70]))
PY
done; done
LT="python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --workdir /tmp/lt --defaults --gpus 1 --prompts 8 --n 8 --steps 3 --variants hybrid --repeat 1"
for mode in 1 0; do
left=$(( 440 - $(el) )); [ $left -lt 90 ] && { echo "no time for fused_mlp=$mode"; break; }
HYBRIDRL_FUSED_MLP=$mode timeout $left $LT --out $OUT/lt8_fused_mlp_$mode.json > $OUT/lt8_fused_mlp_$mode.log 2>&1; echo "lt8 fused_mlp=$mode rc $? after $(el) s"
python - $OUT/lt8_fused_mlp_$mode.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for s in d["variants"]["hybrid#1"]["per_step"]: print({k: round(s[k],3) for k in ("timing_s/step","timing_s/gen","rollout/decode_s","rollout/num_decode_steps","rollout/running_seqs_mean","rollout/tail_time_frac","response_length/clip_ratio")})
PY
done
