# issue 36: the MoE update profile, then two more 30B-A3B LoRA runs (runs 2-3 at this tree)
source .gpu/setup.sh
set -o pipefail
rm -rf /tmp/lt7 /tmp/w /tmp/ray /tmp/lt; df -h /tmp | tail -1; nvidia-smi --query-gpu=name,memory.total --format=csv
start=$(date +%s)
timeout 330 python benchmarks/profile_update.py --preset qwen3-30b-a3b --workdir /tmp/w --rows 256 --n 8 --prompt-len 256 \
  --response-len 256 --repeat 2 --profile-skip 1 --profile-micro 2 --configs lora32:keep24:tok16384,lora32:keep24:tok8192 \
  --out $OUT/update_ops_moe_30b.json > $OUT/update_ops_moe_30b.log 2>&1; echo "profile rc=$? after $(( $(date +%s) - start )) s"
tail -30 $OUT/update_ops_moe_30b.log
left=$(( 580 - ($(date +%s) - start) ))
echo "grpo gets $left s"
timeout $left python benchmarks/grpo_step.py --preset qwen3-30b-a3b --gpus 1 --defaults --prompts 32 --steps 3 --repeat 2 \
  --variants lora32:actor_rollout_ref.model.lora_rank=32 --workdir /tmp/w --out $OUT/grpo_qwen3-30b-a3b_lora32_repeat.json \
  > $OUT/grpo_30b_repeat.log 2>&1; echo "grpo rc=$? after $(( $(date +%s) - start )) s"; grep "\[bench\]\|step [0-9]/" $OUT/grpo_30b_repeat.log | tail -8
