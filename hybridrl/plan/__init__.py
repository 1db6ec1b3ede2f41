"""The run plan: facts of a run derived once on the driver (run_plan.py) — the run's shape, its world size and degrees
and the meshes they imply (shape.py, layout.py), then one sub-plan per role from its planner (rollout_plan.py,
actor_plan.py, critic_plan.py, reward_model_plan.py, sharing sizing.py's rules) — with a per-phase memory model
(memory.py) of the model's shape (model_shape.py)."""

from hybridrl.plan.layout import Layout, derive_layout
from hybridrl.plan.model_shape import ModelShape
from hybridrl.plan.rollout_plan import kv_need
from hybridrl.plan.run_plan import (
    DeviceSpec,
    RunPlan,
    local_device,
    make_plan,
    reward_model_hf_config,
    visible_gpus,
)
from hybridrl.plan.shape import Meshes, Parallelism, parallelism

__all__ = ["DeviceSpec", "Layout", "Meshes", "ModelShape", "Parallelism", "RunPlan", "derive_layout", "kv_need",
           "local_device", "make_plan", "parallelism", "reward_model_hf_config",
           "visible_gpus"]
