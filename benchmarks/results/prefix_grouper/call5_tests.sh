# One H200, fresh: the GPU packing tests and the host-sync test (padded and shared-prompt paths) at commit of
# the host-side packed layout
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
timeout 170 python -m pytest -q -p no:cacheprovider -m gpu tests/training/test_gpu_packing.py \
   tests/training/test_update_sync_gpu.py > $OUT/gpu_tests_call5.log 2>&1; echo "rc=$? t=$SECONDS"
tail -15 $OUT/gpu_tests_call5.log | cut -c1-300
