# issue 14: the two-moment update memory model checked live on the bf16-master runs it was fitted against
# (1.5B and 0.5B, hybridrl defaults + model_dtype=bf16, one run each): predicted vs measured per phase
set -u
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.csv
B=actor_rollout_ref.actor.fsdp_config.model_dtype=bf16
timeout 170 python benchmarks/grpo_step.py --preset qwen2.5-1.5b --gpus 1 --defaults --steps 3 --workdir /tmp/hb15 \
   --variants "hybrid_bf16:$B" --out $OUT/hybridrl_qwen2.5-1.5b_bf16.json > $OUT/hybridrl_1.5b.log 2>&1; echo "1.5B rc=$? t=$SECONDS"
timeout $((300-SECONDS)) python benchmarks/grpo_step.py --preset qwen2.5-0.5b --gpus 1 --defaults --steps 3 --workdir /tmp/hb05 \
   --variants "hybrid_bf16:$B" --out $OUT/hybridrl_qwen2.5-0.5b_bf16.json > $OUT/hybridrl_0.5b.log 2>&1; echo "0.5B rc=$? t=$SECONDS"
python - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/hybridrl_*.json")):
    for k, v in json.load(open(f))["variants"].items():
        s = v["per_step"][-1]
        print(f.split("/")[-1], v["step_s"], {p: (round(s.get(f"plan/predicted_peak_gb/{p}", 0), 2), round(s.get(f"memory/{p}/peak_allocated_gb", 0), 2)) for p in ("gen", "update_actor")})
PY
