"""The one-kernel decode attention (rollout/triton_decode.paged_decode_rope: RoPE on q and the step's k, the K/V
store, attention over the cache plus the step's token, the splits merged by the last one to finish) against the
torch path it replaces (models/rope.apply_rope, the cache store, rollout/attention.paged_decode_reference), on CPU
under the Triton interpreter (TRITON_INTERPRET=1), in fp32 and fp16 (the interpreter's bf16 dots are wrong). The GPU
run of the same comparison, in bf16 and inside a CUDA graph, is in test_rollout_gpu.py."""

import os

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the torch path is the only one")

from hybridrl.models.rope import apply_rope  # noqa: E402
from hybridrl.rollout.attention import paged_decode_reference  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the kernel runs on CPU only under the Triton interpreter: TRITON_INTERPRET=1")

PAGE = 16


def decode_case(B, N, K, D, lens, dtype, seed=0, device="cpu"):
    """A decode step's unrotated q/k/v as views of one qkv row per sequence, cos/sin at each sequence's last
    position, a paged cache of random contents whose block tables are a permutation, the last position's slot."""
    g = torch.Generator(device).manual_seed(seed)
    width = -(-max(lens) // PAGE)
    qkv = torch.randn(B, (N + 2 * K) * D, generator=g, device=device).to(dtype)
    q, k, v = (t.view(B, -1, D) for t in qkv.split([N * D, K * D, K * D], -1))
    cache = torch.randn(2, B * width + 1, PAGE, K, D, generator=g, device=device).to(dtype)
    tables = torch.randperm(B * width, generator=g, device=device).view(B, width).int()
    ctx = torch.tensor(lens, dtype=torch.int32, device=device)
    pos = ctx.long() - 1
    slots = tables.long().gather(1, (pos // PAGE)[:, None]).squeeze(1) * PAGE + pos % PAGE
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, device=device).float() / D)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = (f(torch.cat([ang, ang], -1)).to(dtype) for f in (torch.cos, torch.sin))
    return q, k, v, cos, sin, cache, tables, ctx, slots


def torch_path(q, k, v, cos, sin, cache, tables, ctx, slots, scale):
    cache = cache.clone()
    qr, kr = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    K, D = k.shape[1:]
    cache[0].view(-1, K, D)[slots] = kr
    cache[1].view(-1, K, D)[slots] = v
    return paged_decode_reference(qr, cache[0], cache[1], tables, ctx, scale), cache


@interpreted
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float16, 4e-3)])   # bf16: the GPU test

@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("N,K,D", [(4, 2, 64), (6, 1, 32), (2, 2, 32)])
def test_one_kernel_decode_equals_rope_store_then_attention(dtype, tol, splits, N, K, D):
    from hybridrl.rollout.triton_decode import paged_decode_rope

    # contexts from a padded graph row (1: only the step's own token) to several pages; 8 splits leave some empty
    lens = [1, 2, 17, 70, 130][: 5 if splits != 8 else 4]
    q, k, v, cos, sin, cache, tables, ctx, slots = decode_case(len(lens), N, K, D, lens, dtype)
    ref, ref_cache = torch_path(q, k, v, cos, sin, cache, tables, ctx, slots, D**-0.5)
    counters = torch.zeros(len(lens) * K, dtype=torch.int32)
    for _ in range(2):   # the counters are left at zero: a second launch (the next layer's) merges correctly too
        got_cache = cache.clone()
        got = paged_decode_rope(q, k, v, cos, sin, slots, got_cache[0], got_cache[1], tables, ctx, D**-0.5,
                                counters, block_n=16, num_splits=splits)
        assert torch.equal(counters, torch.zeros_like(counters))
        assert (got.float() - ref.float()).abs().max().item() < tol
        # the stored K/V: the rotated k bit for bit as the torch RoPE rounds it, v as given, nothing else written
        assert torch.equal(got_cache, ref_cache)
    assert torch.equal(q, decode_case(len(lens), N, K, D, lens, dtype)[0])   # q is rotated in registers only


@interpreted
def test_one_kernel_decode_refuses_what_it_cannot_run():
    from hybridrl.rollout.triton_decode import paged_decode_rope

    q, k, v, cos, sin, cache, tables, ctx, slots = decode_case(2, 4, 2, 32, [5, 9], torch.float32)
    with pytest.raises(ValueError, match="counters must be int32 with at least 4"):
        paged_decode_rope(q, k, v, cos, sin, slots, cache[0], cache[1], tables, ctx, 1.0,
                          torch.zeros(3, dtype=torch.int32), num_splits=2)
    with pytest.raises(ValueError, match="contiguous head_dim"):
        paged_decode_rope(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, cos, sin, slots, cache[0],
                          cache[1], tables, ctx, 1.0, torch.zeros(4, dtype=torch.int32), num_splits=2)
