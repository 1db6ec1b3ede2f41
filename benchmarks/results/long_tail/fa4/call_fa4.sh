# session 58: FA4 (fixed install) timed against FA2, its GPU test, then the long tail at the defaults (fa2) and with fa4
source .gpu/setup.sh
source .fa4a/install.sh || exit 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
python -c "
import torch, time
t=time.time()
from flash_attn.cute import flash_attn_varlen_func
print('fa4 import', round(time.time()-t,1), 's; torch', torch.__version__, torch.cuda.get_device_name(0))
from hybridrl.models.varlen_attention import flash_impl
print('auto picks', flash_impl(torch.device('cuda'), 128))
" 2>&1 | tail -4
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/training/test_flash_segments.py > $OUT/gpu_tests_flash.log 2>&1; echo "flash tests rc $? after $(el) s"
tail -3 $OUT/gpu_tests_flash.log
timeout 90 python benchmarks/varlen_attention.py --shape 1.5B --variants fa2,fa4 --out $OUT/varlen_fa4_1.5b.json > $OUT/varlen_fa4_1.5b.log 2>&1; echo "va 1.5B rc $? after $(el) s"
tail -14 $OUT/varlen_fa4_1.5b.log | cut -c1-250
timeout 90 python benchmarks/varlen_attention.py --shape 7B --prompts 16 --limit 16384 --mean-len 3500 --at-limit 0.023 --micro-tokens 16640 --variants fa2,fa4 --out $OUT/varlen_fa4_7b.json > $OUT/varlen_fa4_7b.log 2>&1; echo "va 7B rc $? after $(el) s"
tail -10 $OUT/varlen_fa4_7b.log | cut -c1-250
UPD="python benchmarks/profile_update.py --preset qwen2.5-1.5b --workdir /tmp/hb --rows 256 --n 8 --prompt-len 256 --response-len 4096 --mean-response-len 1000 --repeat 2 --profile-skip 2 --profile-micro 1 --configs full:keep13:tok32768:once"
for impl in fa4 fa2; do
HYBRIDRL_FLASH=$impl timeout 80 $UPD --out $OUT/update_$impl.json > $OUT/update_$impl.log 2>&1; echo "update $impl rc $? after $(el) s"
python -c "
import json,sys; d=json.load(open('$OUT/update_$impl.json'))
for n,c in d['configs'].items(): print('$impl', n, c.get('update_s_each'), round(c.get('tflops',0)), c.get('peak_allocated_gb'), c.get('profile',{}).get('micro_batch_window',{}).get('kernel_s_by_category'), c.get('error'))
" 2>&1 | tail -2
done
LT="python benchmarks/long_tail.py --preset qwen2.5-1.5b --response-len 4096 --mean-len 1000 --eos-scale 4.33313453443048 --workdir /tmp/lt --defaults --gpus 1 --prompts 32 --n 8 --steps 3 --variants hybrid --repeat 1"
for impl in fa4 fa2; do
left=$(( 590 - $(el) )); [ $left -lt 100 ] && { echo "no time for lt $impl"; break; }
HYBRIDRL_FLASH=$impl timeout $left $LT --out $OUT/lt_$impl.json > $OUT/lt_$impl.log 2>&1; echo "lt $impl rc $? after $(el) s"
python .gpu/s57/show_lt.py $OUT/lt_$impl.json 2>&1 | tail -5
done
