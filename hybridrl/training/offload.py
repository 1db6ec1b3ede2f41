"""Move FSDP parameter shards and optimizer state between the GPU and host memory around phases
(`fsdp_config.param_offload` / `optimizer_offload`, the rollout rows of the memory-phase table).

Choices: FSDP2 parameters are DTensors whose local tensor is this rank's shard, so `module.to(device)` moves
exactly the shard (never a full parameter); gradients are dropped on offload (they exist only inside an update).
Optimizer state tensors (AdamW's exp_avg, exp_avg_sq, step) are moved in place in `optimizer.state`, keeping
their keys in the dict so checkpoints and the next step see the same structure; AdamW's scalar `step` stays
on the host where torch keeps it (a CUDA step tensor is only legal with capturable=True).
`torch.cuda.empty_cache()` runs after an offload so the freed blocks return to the pool other phases use.
"""

from __future__ import annotations

import torch

__all__ = ["offload_fsdp_params", "load_fsdp_params", "offload_optimizer", "load_optimizer"]


def _empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@torch.no_grad()
def offload_fsdp_params(module: torch.nn.Module) -> None:
    module.zero_grad(set_to_none=True)
    module.to("cpu")
    _empty_cache()


@torch.no_grad()
def load_fsdp_params(module: torch.nn.Module, device) -> None:
    module.to(torch.device(device), non_blocking=True)


def _move_state(optimizer: torch.optim.Optimizer, device: torch.device, non_blocking: bool) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.device != device:
                state[key] = value.to(device, non_blocking=non_blocking)


@torch.no_grad()
def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    _move_state(optimizer, torch.device("cpu"), non_blocking=False)
    _empty_cache()


@torch.no_grad()
def load_optimizer(optimizer: torch.optim.Optimizer, device) -> None:
    _move_state(optimizer, torch.device(device), non_blocking=True)
