# issue 36: repeats at this tree: the 7B-A1B at the defaults (third run), the 30B-A3B LoRA r32 (runs 2-3)
source .gpu/setup.sh
set -o pipefail
rm -rf /tmp/lt7 /tmp/w /tmp/ray /tmp/lt
start=$(date +%s)
timeout 120 python benchmarks/grpo_step.py --preset qwen3-moe-7b-a1b --gpus 1 --defaults --steps 3 --repeat 1 \
  --variants defaults --workdir /tmp/w --out $OUT/grpo_qwen3-moe-7b-a1b_experts_3.json \
  > $OUT/grpo_7b_a1b_experts_3.log 2>&1; echo "7b-a1b rc=$? after $(( $(date +%s) - start )) s"
grep "\[bench\]" $OUT/grpo_7b_a1b_experts_3.log
rm -rf /tmp/w /tmp/ray
left=$(( 420 - ($(date +%s) - start) ))
echo "30B gets $left s"
timeout $left python benchmarks/grpo_step.py --preset qwen3-30b-a3b --gpus 1 --defaults --prompts 32 --steps 3 --repeat 2 \
  --variants lora32:actor_rollout_ref.model.lora_rank=32 --workdir /tmp/w --out $OUT/grpo_qwen3-30b-a3b_lora32_experts_23.json \
  > $OUT/grpo_30b_experts_23.log 2>&1; echo "30b rc=$? after $(( $(date +%s) - start )) s"; grep "\[bench\]" $OUT/grpo_30b_experts_23.log
