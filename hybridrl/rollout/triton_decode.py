"""Triton paged-attention decode kernel (one query token per sequence).

Choices (DESIGN.md §7: gathering the paged cache then SDPA costs ~10x the K/V read):
- One program per (sequence, kv head): it loads the G = N/K query heads of that group as one
  [G_pad, D] tile (G padded to 16 for tl.dot) and streams the sequence's K/V once, BLOCK_N tokens at a
  time, looking up each token's physical block in the block table (so BLOCK_N may span several
  pages). Online softmax in fp32 (exp2), output in the input dtype; fp32 inputs use IEEE dots (tests).
- The trip count comes from `context_lens` read on the device, so the kernel is CUDA-graph safe.
- Imported lazily: CPU machines without triton never import this module.

Shape legend: B sequences, N q heads, K kv heads, D head_dim, M blocks per sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(Q, KC, VC, Out, BT, CL, scale_log2e,
                         s_qb, s_qh, s_cb, s_ct, s_ch, s_btb, s_ob, s_oh,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                         PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx = tl.load(CL + b)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK_N)
    gmask = g < GROUP
    head = kvh * GROUP + g
    q = tl.load(Q + b * s_qb + head[:, None] * s_qh + d[None, :], mask=gmask[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    for start in range(0, ctx, BLOCK_N):
        pos = start + n
        valid = pos < ctx
        blk = tl.load(BT + b * s_btb + pos // PAGE, mask=valid, other=0).to(tl.int64)
        off = blk * s_cb + (pos % PAGE) * s_ct + kvh * s_ch
        k = tl.load(KC + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2e
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VC + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(Out + b * s_ob + head[:, None] * s_oh + d[None, :], out.to(Out.dtype.element_ty), mask=gmask[:, None])


def paged_decode_triton(q_BND, k_cache, v_cache, block_tables_BM, context_lens_B, scale, block_n: int = 64):
    B, N, D = q_BND.shape
    page, K = k_cache.shape[1], k_cache.shape[2]
    if k_cache.stride(3) != 1 or q_BND.stride(2) != 1 or D & (D - 1):
        raise ValueError(f"paged_decode_triton needs contiguous head_dim (a power of two), got D={D}")
    group = N // K
    out = torch.empty_like(q_BND)
    bt = block_tables_BM.contiguous()
    _paged_decode_kernel[(B, K)](
        q_BND, k_cache, v_cache, out, bt, context_lens_B, scale * 1.4426950408889634,
        q_BND.stride(0), q_BND.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        bt.stride(0), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=D, PAGE=page, BLOCK_N=block_n,
        PRECISION="ieee" if q_BND.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=2,
    )
    return out
