# issue 36: hybridrl's grouped-GEMM experts forward on the GPU: its tests, the 30B-A3B update A/B against transformers'
# grouped_mm (same call, same model), then the GRPO step at the defaults
source .gpu/setup.sh
set -o pipefail
rm -rf /tmp/lt7 /tmp/w /tmp/ray /tmp/lt; df -h /tmp | tail -1
start=$(date +%s)
python -m pytest -q -p no:cacheprovider tests/training/test_moe_experts.py tests/training/test_moe_training.py 2>&1 | tail -4 | tee $OUT/gpu_tests_moe_experts.log
for impl in hybridrl grouped_mm; do
  extra=""; [ $impl = grouped_mm ] && extra="--experts-implementation grouped_mm"
  timeout 200 python benchmarks/profile_update.py --preset qwen3-30b-a3b --workdir /tmp/w --rows 256 --n 8 --prompt-len 256 \
    --response-len 256 --repeat 3 --profile-skip 1 --profile-micro 2 --configs lora32:keep24:tok16384 $extra \
    --out $OUT/update_ops_moe_30b_experts_$impl.json > $OUT/update_ops_moe_30b_experts_$impl.log 2>&1
  echo "profile $impl rc=$? after $(( $(date +%s) - start )) s"; grep "\[update\]" $OUT/update_ops_moe_30b_experts_$impl.log
done
left=$(( 585 - ($(date +%s) - start) ))
echo "grpo gets $left s"
timeout $left python benchmarks/grpo_step.py --preset qwen3-30b-a3b --gpus 1 --defaults --prompts 32 --steps 3 --repeat 1 \
  --variants lora32:actor_rollout_ref.model.lora_rank=32 --workdir /tmp/w --out $OUT/grpo_qwen3-30b-a3b_lora32_experts.json \
  > $OUT/grpo_30b_experts.log 2>&1; echo "grpo rc=$? after $(( $(date +%s) - start )) s"; grep "\[bench\]\|step [0-9]/\|plan\|recomput" $OUT/grpo_30b_experts.log | tail -12
