"""Per-phase GPU memory accounting: `memory/{phase}/peak_allocated_gb`, `.../peak_reserved_gb` and
`.../alloc_retries`.

Each phase resets the CUDA peak counters on entry and reads them on exit, so a phase's number is the highest memory
seen *inside* that phase (the figure the seed's table 3.1 reports). `alloc_retries` counts the times inside the phase
that torch's caching allocator found no free block, released its whole cache and retried the allocation: each one
synchronizes the device and returns every cached segment to CUDA, so a phase that retries runs slower than its
kernels for reasons its peak allocation does not show (the reserved memory sits at the device's size while the
allocated peak stays below it: fragmentation, or memory held outside torch). On CPU nothing is measured and nothing
is reported — a zero would be a made-up number.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

GB = 1024**3


def cuda_active(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def alloc_retries(device: torch.device) -> int:
    """The caching allocator's count of cache-flushing retries on `device` since the process started."""
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


@contextmanager
def track_phase(name: str, metrics: dict, device: torch.device):
    if not cuda_active(device):
        yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    retries = alloc_retries(device)
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
        tkey = f"memory/{name}/alloc_retries"
        metrics[tkey] = metrics.get(tkey, 0) + alloc_retries(device) - retries
        metrics["perf/max_memory_allocated_gb"] = max(metrics.get("perf/max_memory_allocated_gb", 0.0), alloc)
        metrics["perf/max_memory_reserved_gb"] = max(metrics.get("perf/max_memory_reserved_gb", 0.0), reserved)
