# 1.5B at equal weight precision: hybridrl defaults with bf16 masters (3 runs) vs TRL bf16 weights (2 runs), and a
# 0.5B bf16-master run for the memory model (predicted vs measured per phase)
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
B=actor_rollout_ref.actor.fsdp_config.model_dtype=bf16
timeout $((300-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-1.5b --gpus 1 --defaults --steps 4 --repeat 3 \
   --workdir /tmp/hybridrl_bench --variants "hybrid_bf16:$B" --out $OUT/hybridrl_qwen2.5-1.5b_bf16.json \
   > $OUT/hybridrl_1.5b.log 2>&1; echo "hybridrl 1.5B rc=$? t=$SECONDS"
W=/tmp/hybridrl_bench; DATA=$(ls $W/data/prompts_*x256.parquet | head -1)
for i in 1 2; do
  timeout $((300+90*i-SECONDS)) python benchmarks/trl_grpo.py --model $W/models/qwen2.5-1.5b --prompts $DATA --steps 2 \
     --batch-prompts 64 --n 8 --max-prompt-len 256 --max-new-tokens 256 --weights bf16 --gradient-checkpointing \
     --ignore-eos --reward last_int --out $OUT/trl_qwen2.5-1.5b_bf16_$i.json > $OUT/trl_1.5b_$i.log 2>&1; echo "trl $i rc=$? t=$SECONDS"
done
timeout $((585-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-0.5b --gpus 1 --defaults --steps 3 \
   --workdir /tmp/hybridrl_bench05 --variants "hybrid_bf16:$B" --out $OUT/hybridrl_qwen2.5-0.5b_bf16.json \
   > $OUT/hybridrl_0.5b.log 2>&1; echo "hybridrl 0.5B rc=$? t=$SECONDS"
grep -hE "^\[bench\]|auto:" $OUT/hybridrl_*.log | cut -c1-250 | tail -12
grep -h "median_step_s" $OUT/trl_1.5b_*.log | cut -c1-300
