"""Host-to-device copies that do not stop the host.

A copy from pageable host memory waits for the GPU's queue to drain before it starts (CUDA stages it through a
pinned buffer) and torch then waits for it to end: one such copy per micro-batch and the host can no longer
queue the next micro-batch's kernels while the GPU runs this one. The trainers keep their rows on the host and
move each micro-batch with `to_device`: the rows are copied into pinned memory on the host and the device copy
is queued behind the GPU's work (torch's pinned allocator keeps that buffer until the copy has run)."""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`; a host tensor bound for a GPU goes through pinned memory without blocking."""
    device = torch.device(device)
    if tensor.device.type == "cpu" and device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
