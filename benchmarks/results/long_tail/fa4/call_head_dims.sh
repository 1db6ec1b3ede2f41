# session 59 call A: FA4 head dims (the bf16 shared-prompt gradient failure at head_dim 16), the fa2 control of that
# failing test, the decode step at tail batch sizes with the fused MLP on / off (kernels + graph ms/step), fused qkv
source .gpu/setup.sh
source .fa4a/install.sh || echo "no FA4"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/training/test_flash_segments.py -k fa4_head_dims -rA > $OUT/fa4_head_dims.log 2>&1; echo "fa4 dims rc $? after $(el) s"
grep -E "PASSED|FAILED|SKIPPED|passed|failed" $OUT/fa4_head_dims.log | tail -16
HYBRIDRL_FLASH=fa2 timeout 60 python -m pytest -q -m gpu -p no:cacheprovider tests/training/test_gpu_packing.py > $OUT/packing_fa2.log 2>&1; echo "packing fa2 rc $? after $(el) s"; tail -2 $OUT/packing_fa2.log
for rows in 8 16; do for m in 1 0; do
HYBRIDRL_FUSED_MLP=$m timeout 120 python benchmarks/profile_decode.py --model 1.5B --batch $rows --prompt-len 1024 --new-tokens 256 --out $OUT/pd_b${rows}_mlp$m.json > $OUT/pd_b${rows}_mlp$m.log 2>&1
echo "pd rows=$rows mlp=$m rc $? after $(el) s"
python - $OUT/pd_b${rows}_mlp$m.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]));e=d["eager_profile"]
print(" graph ms/step %.3f  eager kernel ms/step %.3f  byte floor ms %.3f" % (d["graph_decode_ms_per_step"], e["kernel_ms_per_step"], d["byte_floor"]["byte_floor_ms"]))
for k,v in e["top_kernels_ms_per_step"][:8]: print("   %.4f %s" % (v, k[:90]))
PY
done; done
left=$(( 590 - $(el) )); [ $left -gt 60 ] && timeout $left python benchmarks/decode_fused_qkv.py --model 1.5B --rows 1,4,8,16 --out $OUT/decode_fused_qkv_1.5b.json > $OUT/decode_fused_qkv.log 2>&1; echo "qkv rc $? after $(el) s"; tail -15 $OUT/decode_fused_qkv.log
