#!/usr/bin/env bash
# Device call 1 (fresh nvidia-h200): gpu_suite.sh part 17 (shared-prompt GPU tests, 7B full update with/without)
source .gpu/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.csv"
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/device.csv"
bash benchmarks/gpu_suite.sh 17 "$OUT" 2>&1 | tail -60
