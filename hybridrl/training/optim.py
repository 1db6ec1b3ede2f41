"""AdamW + learning-rate schedule from the typed optim section (OptimConfig, verl's keys: `optim.lr`,
`weight_decay`, `betas`, `lr_warmup_steps`, `lr_warmup_steps_ratio`, `warmup_style`, `min_lr_ratio`,
`total_training_steps`).

On GPUs AdamW runs as one fused kernel per tensor group (`fused=True`): it updates parameters and both moments
in place. The default multi-tensor ("foreach") path first materialises sqrt(exp_avg_sq) for every tensor at
once, a temporary as large as the whole optimizer moment: with fp32 masters of a 7B model on one GPU that is
28 GiB more at the step than at any other point of the update. CPU runs keep the foreach path.

Choices: one LambdaLR whose factor is a pure function of the step, so the scheduler state is just the step
count (checkpoints stay tiny and resumable). Warmup is linear from 0 at step 0 (verl's
`get_constant/cosine_schedule_with_warmup`);
`lr_warmup_steps` >= 0 wins over the ratio, as in verl. After warmup: `constant` keeps lr, `cosine` decays
to `min_lr_ratio * lr` at `total_training_steps`. The scheduler steps once per training step (per
`update_policy` / SFT optimizer step).
"""

from __future__ import annotations

import math

import torch

from hybridrl.config.sections.optim import OptimConfig

__all__ = ["ADAMW_EPS", "build_optimizer", "build_lr_scheduler", "lr_factor"]

ADAMW_EPS = 1e-8   # torch's default; no config key sets it


def _check_section(optim_cfg) -> None:
    if not isinstance(optim_cfg, OptimConfig):
        raise TypeError(f"optim config must be the typed OptimConfig section (e.g. load_config(...).actor_rollout_ref"
                        f".actor.optim), got {type(optim_cfg).__name__}")


def build_optimizer(params, optim_cfg: OptimConfig, fused: bool = False) -> torch.optim.Optimizer:
    _check_section(optim_cfg)
    lr = float(optim_cfg.lr)
    if lr < 0:
        raise ValueError(f"optim.lr={lr} must be >= 0")
    betas = tuple(float(b) for b in optim_cfg.betas)
    if len(betas) != 2:
        raise ValueError(f"optim.betas={list(betas)} must have two values")
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=float(optim_cfg.weight_decay), eps=ADAMW_EPS,
                             fused=True if fused else None)


def lr_factor(step: int, warmup_steps: int, total_steps: int, style: str, min_lr_ratio: float) -> float:
    if warmup_steps > 0 and step < warmup_steps:
        return step / warmup_steps
    if style == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: OptimConfig,
                       total_training_steps: int | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    _check_section(optim_cfg)
    total = int(total_training_steps if total_training_steps is not None else optim_cfg.total_training_steps)
    style = optim_cfg.warmup_style
    if style not in ("constant", "cosine"):
        raise ValueError(f"optim.warmup_style={style!r}: use constant or cosine")
    min_ratio = float(optim_cfg.min_lr_ratio)
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"optim.min_lr_ratio={min_ratio} must be in [0, 1]")
    warmup = int(optim_cfg.lr_warmup_steps)
    if warmup < 0:
        ratio = float(optim_cfg.lr_warmup_steps_ratio)
        if ratio > 0 and total <= 0:
            raise ValueError(f"optim.lr_warmup_steps_ratio={ratio} needs optim.total_training_steps > 0, got {total}")
        warmup = int(ratio * max(total, 0))
    if style == "cosine" and total <= 0:
        raise ValueError(f"optim.warmup_style=cosine needs optim.total_training_steps > 0, got {total}")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, total, style, min_ratio))
