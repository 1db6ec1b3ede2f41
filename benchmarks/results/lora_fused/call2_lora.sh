# One H200, after the fused LoRA linear, Liger's kernels (use_liger auto) and partial recompute (checkpointing
# auto): the Liger GPU correctness test, then 7B LoRA r64 GRPO at the defaults, runs 1 and 2
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
W=/tmp/b7; M=$W/models/qwen2.5-7b
[ -f $M/config.json ] || python -c "from hybridrl.assets.tiny_model import write_size_preset as w; w('$M','qwen2.5-7b',weights=True)" > $OUT/prep.log 2>&1
python -c "from pathlib import Path; import sys; sys.path.insert(0, 'benchmarks'); from grpo_step import make_prompts as m; print(m(Path('$W/data'), Path('$M'), 256, 256))" >> $OUT/prep.log 2>&1
echo "prep done t=$SECONDS" | tee -a $OUT/prep.log
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/training/test_liger_gpu.py \
   tests/training/test_update_sync_gpu.py > $OUT/gpu_tests.log 2>&1; rc=$?; echo "gpu tests rc=$rc t=$SECONDS"; tail -3 $OUT/gpu_tests.log
L="actor_rollout_ref.model.lora_rank=64;actor_rollout_ref.model.lora_alpha=128"
[ $rc = 0 ] || L="$L;actor_rollout_ref.model.use_liger=false"   # Liger failed its check: measure without it
timeout $((590-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --repeat 2 \
   --workdir $W --variants "lora64:$L" --out $OUT/hybridrl_qwen2.5-7b_lora_runs12.json > $OUT/hybridrl_7b_lora_runs12.log 2>&1
echo "lora rc=$? t=$SECONDS"
grep -E "^\[bench\]|auto:" $OUT/hybridrl_7b_lora_runs12.log | cut -c1-330 | head -12
