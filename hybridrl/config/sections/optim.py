"""Sections shared by several roles: the optimizer and the mixed precision of FSDP."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.values import Dtype, WarmupStyle


@dataclass(frozen=True)
class MixedPrecisionConfig(Section):
    """`actor_rollout_ref.actor.fsdp_config.mixed_precision` (and SFT's `model.fsdp_config.mixed_precision`)."""

    param_dtype: Dtype
    """compute dtype of forward/backward"""
    reduce_dtype: Dtype
    """gradient reduce-scatter dtype over two or more ranks (one rank: the master weights' dtype)"""


@dataclass(frozen=True)
class OptimConfig(Section):
    """`actor_rollout_ref.actor.optim` and `critic.optim`: AdamW and its learning-rate schedule."""

    lr: float
    """AdamW learning rate"""
    weight_decay: float
    """AdamW weight decay"""
    betas: list[float]
    """AdamW betas"""
    lr_warmup_steps: int
    """-1 = use lr_warmup_steps_ratio"""
    lr_warmup_steps_ratio: float
    """warmup steps as a fraction of total training steps"""
    warmup_style: WarmupStyle
    """constant | cosine (verl's engine workers spell it optim.lr_scheduler_type, read as this key)"""
    min_lr_ratio: float
    """cosine schedule floor as a fraction of lr"""
    total_training_steps: int
    """filled in by the trainer"""
