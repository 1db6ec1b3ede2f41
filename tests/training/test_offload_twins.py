"""The host twins of offloaded tensors: packed into power-of-two pinned buffers (torch's pinned allocator rounds
every allocation up to a power of two), each twin a view of the exact shape and dtype, none overlapping another,
kept across offloads. The packing runs on CPU; the pinned allocation itself is faked here (a CPU torch has none) and
checked on a GPU by test_offload_gpu.py."""

import random

import pytest
import torch

from hybridrl.training import offload
from hybridrl.training.offload import PIN_ALIGN, pack_pow2


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _adamw_state_bytes(hidden, inter, vocab, layers, kv, tied):
    """fp32 exp_avg and exp_avg_sq of a Qwen2-shaped model, one tensor per parameter."""
    per_layer = [hidden * hidden, hidden, kv * hidden, kv, kv * hidden, kv, hidden * hidden, inter * hidden,
                 inter * hidden, hidden * inter, hidden, hidden]
    numels = per_layer * layers + [vocab * hidden] * (1 if tied else 2) + [hidden]
    return [4 * n for n in numels] * 2


def _check_packing(sizes, caps, places):
    assert all(c == _pow2_ceil(c) for c in caps)
    spans = {}
    for n, (b, offset) in zip(sizes, places):
        assert offset % PIN_ALIGN == 0 and 0 <= offset and offset + n <= caps[b]
        spans.setdefault(b, []).append((offset, offset + n))
    for b, ranges in spans.items():
        ranges.sort()
        assert all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:])), f"buffer {b} overlaps"


@pytest.mark.parametrize("shape,bound", [((3584, 18944, 152064, 28, 512, False), 1.02),    # Qwen2.5-7B: 60.9 GB
                                         ((1536, 8960, 151936, 28, 256, True), 1.01),      # 1.5B: 12.3 GB
                                         ((896, 4864, 151936, 24, 128, True), 1.03)])      # 0.5B: 3.9 GB
def test_model_states_pack_within_a_few_percent_where_one_buffer_each_doubles_them(shape, bound):
    sizes = _adamw_state_bytes(*shape)
    caps, places = pack_pow2(sizes)
    _check_packing(sizes, caps, places)
    assert sum(caps) <= bound * sum(sizes)
    assert sum(caps) < sum(_pow2_ceil(n) for n in sizes)   # what one pinned buffer per tensor takes


def test_random_sizes_pack_without_overlap():
    rng = random.Random(0)
    for trial in range(20):
        sizes = [rng.choice([0, 1, 3, 511, 512, 4097]) if rng.random() < 0.3 else rng.randrange(1, 1 << 26)
                 for _ in range(rng.randrange(1, 60))]
        caps, places = pack_pow2(sizes)
        _check_packing(sizes, caps, places)
        assert sum(caps) <= sum(_pow2_ceil(max(n, PIN_ALIGN)) for n in sizes) + (1 << 20), trial


def test_twins_are_exact_views_into_shared_buffers_and_kept(monkeypatch):
    allocated = []
    monkeypatch.setattr(offload.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(offload, "_PINNING_SET", [True])   # no allocator settings on a CPU torch
    monkeypatch.setattr(offload, "_pinned_bytes", lambda n: allocated.append(n) or torch.empty(n, dtype=torch.uint8))
    likes = {"a": torch.empty(300, 7), "b": torch.empty(5, dtype=torch.bfloat16), "c": torch.empty(0, 4),
             "d": torch.empty(2, 3, dtype=torch.int64), "e": torch.empty(1000, 1000)}
    twins = {}
    offload._host_twins(twins, list(likes.items()))
    assert len(allocated) < len(likes) and all(n == _pow2_ceil(n) for n in allocated)
    for slot, like in likes.items():
        assert twins[slot].shape == like.shape and twins[slot].dtype == like.dtype
    for i, (slot, like) in enumerate(likes.items()):   # each twin's bytes are its own
        twins[slot].copy_(torch.full(like.shape, i + 1, dtype=like.dtype))
    for i, (slot, like) in enumerate(likes.items()):
        assert torch.equal(twins[slot], torch.full(like.shape, i + 1, dtype=like.dtype)), slot
    kept, n_alloc = dict(twins), len(allocated)
    offload._host_twins(twins, list(likes.items()))   # the next offload: nothing new
    assert len(allocated) == n_alloc and all(twins[k] is kept[k] for k in likes)
    offload._host_twins(twins, [("a", torch.empty(301, 7))])   # a changed shape gets a twin of its own
    assert twins["a"].shape == (301, 7) and len(allocated) == n_alloc + 1 and twins["e"] is kept["e"]
