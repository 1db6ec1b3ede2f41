"""Activation offload for training forwards (`model.enable_activation_offload`, verl's key): tensors autograd saves
for backward go to host memory at the forward and come back at the backward.

Choices:
- Only with gradient checkpointing (the config refuses it without). Inside a checkpointed layer torch's own
  saved-tensor hook is the innermost and keeps nothing, so what reaches this hook is what checkpointing keeps
  alive: each layer's input (saved by the non-reentrant checkpoint for its recompute) and the tensors saved
  outside the layers (final norm, the log-prob head's hidden rows). On the GPU that leaves one layer's graph
  plus the tensors being copied, instead of every layer's input: tokens x hidden x 2 bytes per layer.
- Parameters and views of them are never moved (a linear outside the layers, like the head, saves its weight as
  weight.t(); FSDP's unsharded weights would be copied every micro-batch), nor tensors under 1 MiB.
- Copies run on the compute stream, into pinned buffers from torch's caching host allocator, non-blocking:
  stream order makes reuse of the freed GPU memory safe and the backward's copy back lands before the kernels
  that read it. They are not overlapped with compute (a side stream would hide them; not done).
- A CPU run copies to fresh host tensors: no memory saved, kept so the path is the same one CI tests.
"""

from __future__ import annotations

import contextlib

import torch

MIN_BYTES = 1 << 20


def _is_parameter(t: torch.Tensor) -> bool:
    """A parameter or a view of one (a linear saves its weight as weight.t())."""
    return isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)


def offload_saved_activations(stats: dict | None = None):
    """Context for a training forward. `stats` (optional) counts `tensors` and `bytes` moved to the host."""

    def pack(t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        if nbytes < MIN_BYTES or t.layout != torch.strided or _is_parameter(t):
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda).copy_(t, non_blocking=t.is_cuda)
        if stats is not None:
            stats["tensors"] = stats.get("tensors", 0) + 1
            stats["bytes"] = stats.get("bytes", 0) + nbytes
        return t.device, host

    def unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=device.type == "cuda")

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def maybe_offload(enabled: bool, stats: dict | None = None):
    return offload_saved_activations(stats) if enabled else contextlib.nullcontext()
