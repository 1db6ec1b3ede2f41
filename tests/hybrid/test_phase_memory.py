"""Per-phase memory accounting (hybrid/memory.py): on CPU nothing is reported; on a GPU the allocator's
cache-flushing retries inside a phase are counted."""

import pytest
import torch

from hybridrl.hybrid.memory import track_phase


def test_cpu_phase_reports_nothing():
    metrics = {}
    with track_phase("update_actor", metrics, torch.device("cpu")):
        torch.ones(8)
    assert metrics == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_phase_counts_allocator_retries():
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(dev).total_memory
    block = 256 << 20
    # a cap one block above what is reserved now: a request for four blocks fails even after the allocator has
    # released its cache and retried once (the retry is counted, then the request raises)
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(dev) + block) / total, dev)
    metrics = {}
    try:
        with track_phase("update_actor", metrics, dev):
            kept = torch.empty(block // 2, dtype=torch.uint8, device=dev)
            with pytest.raises(torch.OutOfMemoryError):
                torch.empty(4 * block, dtype=torch.uint8, device=dev)
            del kept
        with track_phase("gen", metrics, dev):
            torch.ones(16, device=dev)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
    assert metrics["memory/update_actor/alloc_retries"] >= 1
    assert metrics["memory/gen/alloc_retries"] == 0
    assert metrics["memory/update_actor/peak_allocated_gb"] > 0
