# One H200: the GPU packing tests (FlexAttention with the shared-prompt mask vs the padded path), then 7B full
# fine-tuning GRPO at the defaults (use_prefix_grouper auto = on), runs 1 and 2
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
W=/tmp/b7; M=$W/models/qwen2.5-7b
[ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M','qwen2.5-7b',weights=True)" > $OUT/prep.log 2>&1
python -c "from pathlib import Path; import sys; sys.path.insert(0, 'benchmarks'); from grpo_step import make_prompts as m; print(m(Path('$W/data'), Path('$M'), 256, 256))" >> $OUT/prep.log 2>&1
echo "prep done t=$SECONDS" | tee -a $OUT/prep.log
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/training/test_gpu_packing.py > $OUT/gpu_tests.log 2>&1
rc=$?; echo "gpu tests rc=$rc t=$SECONDS"; tail -3 $OUT/gpu_tests.log
V=full; [ $rc = 0 ] || V="full:actor_rollout_ref.actor.use_prefix_grouper=false"   # failed its check: without it
timeout $((595-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --repeat 2 \
   --workdir $W --variants "$V" --out $OUT/hybridrl_qwen2.5-7b_full_runs12.json > $OUT/hybridrl_7b_full_runs12.log 2>&1
echo "full rc=$? t=$SECONDS"
grep -E "^\[bench\]|auto:" $OUT/hybridrl_7b_full_runs12.log | cut -c1-330 | head -14
