# One H200, fresh: the host-sync test again, its FlexAttention warm-up (compile, autotune) now outside torch's sync
# debug mode (call5: inductor found no flex_attention kernel choice when compiling under it)
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/training/test_update_sync_gpu.py > $OUT/gpu_tests_call6.log 2>&1
echo "rc=$? t=$SECONDS"; grep -E "passed|failed|^E .*(assert|Error)" $OUT/gpu_tests_call6.log | head -8 | cut -c1-300
