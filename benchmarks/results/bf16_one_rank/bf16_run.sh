# Sourced with the run number: hybridrl at the defaults with bf16 master weights, three steps (the first warms up)
timeout 200 python benchmarks/grpo_step.py --preset qwen2.5-7b --gpus 1 --defaults --steps 3 --workdir $W \
   --variants "bf16:actor_rollout_ref.actor.fsdp_config.model_dtype=bf16" \
   --out $OUT/hybridrl_qwen2.5-7b_full_bf16_run$1.json > $OUT/hybridrl_7b_full_bf16_run$1.log 2>&1
echo "bf16 run $1 rc=$? t=$SECONDS"; grep -E "^\[bench\]|^step" $OUT/hybridrl_7b_full_bf16_run$1.log | cut -c1-330
