"""Per-phase GPU memory accounting: `memory/{phase}/peak_allocated_gb` and `.../peak_reserved_gb`.

Each phase resets the CUDA peak counters on entry and reads them on exit, so a phase's number is the highest memory
seen *inside* that phase (the figure the seed's table 3.1 reports). On CPU nothing is measured and nothing is reported —
a zero would be a made-up number.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

GB = 1024**3


def cuda_active(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


@contextmanager
def track_phase(name: str, metrics: dict, device: torch.device):
    if not cuda_active(device):
        yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        yield
    finally:
        torch.cuda.synchronize(device)
        alloc = torch.cuda.max_memory_allocated(device) / GB
        reserved = torch.cuda.max_memory_reserved(device) / GB
        key = f"memory/{name}/peak_allocated_gb"
        metrics[key] = max(metrics.get(key, 0.0), alloc)
        rkey = f"memory/{name}/peak_reserved_gb"
        metrics[rkey] = max(metrics.get(rkey, 0.0), reserved)
        metrics["perf/max_memory_allocated_gb"] = max(metrics.get("perf/max_memory_allocated_gb", 0.0), alloc)
        metrics["perf/max_memory_reserved_gb"] = max(metrics.get("perf/max_memory_reserved_gb", 0.0), reserved)
