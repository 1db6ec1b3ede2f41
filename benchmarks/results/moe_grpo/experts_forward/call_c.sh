# issue 36: the 7B-A1B shape fully fine-tuned at the defaults (two runs, hybridrl's experts forward), then TRL's
# GRPOTrainer on the same model and prompts (full fine-tuning, micro-batch 32 x 16 accumulation steps), its first step
source .gpu/setup.sh
set -o pipefail
rm -rf /tmp/lt7 /tmp/w /tmp/ray /tmp/lt; df -h /tmp | tail -1
start=$(date +%s)
timeout 260 python benchmarks/grpo_step.py --preset qwen3-moe-7b-a1b --gpus 1 --defaults --steps 3 --repeat 2 \
  --variants defaults --workdir /tmp/w --out $OUT/grpo_qwen3-moe-7b-a1b_experts.json \
  > $OUT/grpo_7b_a1b_experts.log 2>&1; echo "grpo rc=$? after $(( $(date +%s) - start )) s"
grep "\[bench\]\|step [0-9]/\|auto:" $OUT/grpo_7b_a1b_experts.log | tail -12
left=$(( 560 - ($(date +%s) - start) ))
echo "TRL gets $left s"
timeout $left python benchmarks/trl_grpo.py --model /tmp/w/models/qwen3-moe-7b-a1b --prompts /tmp/w/data/prompts_256x256.parquet \
  --steps 0 --batch-prompts 64 --n 8 --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --gradient-checkpointing \
  --ignore-eos --reward last_int --micro-batch 32 --out $OUT/trl_qwen3-moe-7b-a1b.json 2>&1 | tee $OUT/trl_7b_a1b.log | grep -v "it/s\]" | tail -20
echo "trl rc=$?"
