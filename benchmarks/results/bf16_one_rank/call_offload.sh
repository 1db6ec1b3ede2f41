#!/usr/bin/env bash
# Device call (fresh H200, the session's last device minutes): activation offload in the update on the GPU — the
# Qwen2.5-1.5B shape at the defaults (fp32 masters) with and without model.enable_activation_offload, one process,
# three steps each (the first warms up)
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
timeout 330 python benchmarks/grpo_step.py --preset qwen2.5-1.5b --gpus 1 --defaults --steps 3 --workdir /tmp/b15 \
   --variants "full,offload:actor_rollout_ref.model.enable_activation_offload=true" \
   --out $OUT/hybridrl_qwen2.5-1.5b_activation_offload.json > $OUT/hybridrl_1.5b_activation_offload.log 2>&1
echo "rc=$? t=$SECONDS"; grep -E "^\[bench\]|^step|auto:.*(checkpoint|offload)" $OUT/hybridrl_1.5b_activation_offload.log | cut -c1-300
