"""The run plan: facts of a run derived once on the driver (run_plan.py) with a per-phase memory model
(memory.py) of the model's shape (model_shape.py)."""

from hybridrl.plan.model_shape import ModelShape
from hybridrl.plan.run_plan import (
    DeviceSpec,
    RunPlan,
    kv_need,
    local_device,
    make_plan,
    reward_model_hf_config,
)

__all__ = ["DeviceSpec", "ModelShape", "RunPlan", "kv_need", "local_device", "make_plan", "reward_model_hf_config"]
