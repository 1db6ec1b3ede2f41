"""Fused Triton kernels for the rollout decoder's small ops: residual-add + RMSNorm, RoPE + K/V cache
store, SiLU-and-mul.

Choices:
- Why: at decode batch sizes (a few hundred rows) each elementwise op is a separate ~3 us kernel,
  and the torch versions of RMSNorm (7 ops), RoPE on q and k (~10) and the cache writes (2) put ~35
  kernels in every layer; fused, a layer is ~9 kernels (3 matmuls, 2 norms, rope+store, attention,
  silu-mul, o_proj). The same kernels serve prefill, where they save whole memory passes.
- Meant to be bit-compatible with the torch/HF formulas in the model dtype: every intermediate that
  torch rounds to bf16 (x*rsqrt(var) before the weight multiply; q*cos and rot(q)*sin before their
  sum; silu before the multiply) is rounded here too, by `_round` (integer RTNE for bf16: on the H200
  a plain .to(bf16).to(fp32) round trip left values unrounded, so RoPE differed from torch by a few
  bf16 ulps). Under TRITON_INTERPRET the bf16 outputs equal torch's bit for bit (RMSNorm only up to
  the fp32 variance sum order); the rounding fix has not been re-run on the GPU yet.
- Used only when `enabled(t)`: a CUDA tensor, triton importable, and env HYBRIDRL_FUSED != "0". Tests set
  HYBRIDRL_FUSED=force to run the kernels on CPU under TRITON_INTERPRET=1. The torch path stays the
  reference (CPU, and the oracle in the tests).

Shape legend: T tokens, H hidden, N q heads, K kv heads, D head_dim, I intermediate.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines without triton: the torch path only
    triton = tl = None


def _triton_ok() -> bool:
    return triton is not None


def head_dim_fits(head_dim: int) -> bool:
    """Whether the Triton decode kernels (this module's RoPE + K/V store, the paged decode attention) take this
    head_dim: they tile it whole, so it must be a power of two (64 and 128 in every supported family's checkpoints);
    other widths decode through the torch paths."""
    return head_dim > 0 and head_dim & (head_dim - 1) == 0


def enabled(t: torch.Tensor) -> bool:
    mode = os.environ.get("HYBRIDRL_FUSED", "1")
    if mode == "0" or not _triton_ok():
        return False
    return t.is_cuda or mode == "force"


if triton is not None:

    @triton.jit
    def _round(x, dt: tl.constexpr):
        """fp32 -> nearest `dt` value, kept in fp32. bf16 by integer RTNE on the bits: the GPU run showed
        that a plain x.to(bf16).to(fp32) round trip did not round (the values carried more precision than
        the torch path), and integer ops cannot be folded away; also exact under the interpreter, whose
        bf16 cast truncates. NaN payloads aside, identical to torch's fp32->bf16 conversion."""
        if dt == tl.bfloat16:
            u = x.to(tl.uint32, bitcast=True)
            u = u + 0x7FFF + ((u >> 16) & 1)
            return ((u >> 16) << 16).to(tl.float32, bitcast=True)
        elif dt == tl.float32:
            return x
        else:
            return x.to(dt).to(tl.float32)

    @triton.jit
    def add_rmsnorm_kernel(X, R, W, Y, s_x, s_r, s_y, H, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(X + row * s_x + cols, mask=mask, other=0.0)
        if HAS_RES:
            r = tl.load(R + row * s_r + cols, mask=mask, other=0.0)
            xf = _round(x.to(tl.float32) + r.to(tl.float32), x.dtype)
            tl.store(R + row * s_r + cols, xf.to(x.dtype), mask=mask)
        else:
            xf = x.to(tl.float32)
        var = tl.sum(xf * xf, 0) / H
        normed = _round(xf * tl.rsqrt(var + eps), x.dtype)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * s_y + cols, _round(w * normed, x.dtype).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _rot(X, C, S, base, hrows, d1, d2, mask):
        x1 = tl.load(X + base + hrows + d1, mask=mask, other=0.0)
        x2 = tl.load(X + base + hrows + d2, mask=mask, other=0.0)
        c1 = tl.load(C + d1).to(tl.float32)
        c2 = tl.load(C + d2).to(tl.float32)
        s1 = tl.load(S + d1).to(tl.float32)
        s2 = tl.load(S + d2).to(tl.float32)
        dt = x1.dtype
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        o1 = _round(_round(f1 * c1, dt) - _round(f2 * s1, dt), dt).to(dt)
        o2 = _round(_round(f2 * c2, dt) + _round(f1 * s2, dt), dt).to(dt)
        return o1, o2

    @triton.jit
    def rope_store_kernel(Q, K, V, COS, SIN, KC, VC, SLOT, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_cos,
                          s_cs, s_ch, NQ, NK, NQ_PAD: tl.constexpr, NK_PAD: tl.constexpr, HALF: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        d1 = tl.arange(0, HALF)[None, :]
        d2 = d1 + HALF
        C = COS + t * s_cos
        S = SIN + t * s_cos
        hq = tl.arange(0, NQ_PAD)[:, None]
        mq = hq < NQ
        o1, o2 = _rot(Q, C, S, t * s_qt, hq * s_qh, d1, d2, mq)
        tl.store(Q + t * s_qt + hq * s_qh + d1, o1, mask=mq)
        tl.store(Q + t * s_qt + hq * s_qh + d2, o2, mask=mq)
        hk = tl.arange(0, NK_PAD)[:, None]
        mk = hk < NK
        k1, k2 = _rot(K, C, S, t * s_kt, hk * s_kh, d1, d2, mk)
        tl.store(K + t * s_kt + hk * s_kh + d1, k1, mask=mk)
        tl.store(K + t * s_kt + hk * s_kh + d2, k2, mask=mk)
        slot = tl.load(SLOT + t).to(tl.int64)
        cbase = slot * s_cs + hk * s_ch
        tl.store(KC + cbase + d1, k1, mask=mk)
        tl.store(KC + cbase + d2, k2, mask=mk)
        v1 = tl.load(V + t * s_vt + hk * s_vh + d1, mask=mk, other=0.0)
        v2 = tl.load(V + t * s_vt + hk * s_vh + d2, mask=mk, other=0.0)
        tl.store(VC + cbase + d1, v1, mask=mk)
        tl.store(VC + cbase + d2, v2, mask=mk)

    @triton.jit
    def rope_store_head_kernel(Q, K, V, COS, SIN, KC, VC, SLOT, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_cos,
                               s_cs, s_ch, NQ, HALF: tl.constexpr):
        """rope_store_kernel with one program per (token, head): q heads first, then kv heads."""
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        d1 = tl.arange(0, HALF)
        d2 = d1 + HALF
        m = d1 < HALF
        C = COS + t * s_cos
        S = SIN + t * s_cos
        if h < NQ:
            o1, o2 = _rot(Q, C, S, t * s_qt, h * s_qh, d1, d2, m)
            tl.store(Q + t * s_qt + h * s_qh + d1, o1)
            tl.store(Q + t * s_qt + h * s_qh + d2, o2)
        else:
            hk = h - NQ
            k1, k2 = _rot(K, C, S, t * s_kt, hk * s_kh, d1, d2, m)
            tl.store(K + t * s_kt + hk * s_kh + d1, k1)
            tl.store(K + t * s_kt + hk * s_kh + d2, k2)
            slot = tl.load(SLOT + t).to(tl.int64)
            cbase = slot * s_cs + hk * s_ch
            tl.store(KC + cbase + d1, k1)
            tl.store(KC + cbase + d2, k2)
            tl.store(VC + cbase + d1, tl.load(V + t * s_vt + hk * s_vh + d1))
            tl.store(VC + cbase + d2, tl.load(V + t * s_vt + hk * s_vh + d2))

    @triton.jit
    def silu_mul_kernel(GU, Y, s_g, s_y, I, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < I
        g = tl.load(GU + row * s_g + cols, mask=mask, other=0.0)
        u = tl.load(GU + row * s_g + I + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = _round(gf / (1.0 + tl.exp(-gf)), g.dtype)
        tl.store(Y + row * s_y + cols, _round(act * u.to(tl.float32), g.dtype).to(Y.dtype.element_ty), mask=mask)


def _kernels():
    return triton, add_rmsnorm_kernel, rope_store_kernel, silu_mul_kernel


def add_rmsnorm(x_TH, residual_TH, weight_H, eps: float):
    """-> (rmsnorm(x + residual) * weight, x + residual). The sum is written into `residual` in place
    (it is the decoder's own buffer); with residual None the sum is x itself."""
    triton, kernel, _, _ = _kernels()
    T, H = x_TH.shape
    y = torch.empty_like(x_TH)
    has_res = residual_TH is not None
    r = residual_TH if has_res else x_TH
    if T:
        kernel[(T,)](x_TH, r, weight_H, y, x_TH.stride(0), r.stride(0), y.stride(0), H, eps,
                     HAS_RES=has_res, BLOCK=triton.next_power_of_2(H), num_warps=4 if H <= 4096 else 8)
    return y, r


PER_HEAD_MAX_TOKENS = 128   # rope_store_kv: one program per (token, head) up to this many tokens


def rope_store_kv(q_TND, k_TKD, v_TKD, cos_TD, sin_TD, k_cache, v_cache, slots_T, per_head: bool | None = None):
    """RoPE on q and k in place (any row/head strides, head_dim contiguous), then k and v stored at
    `slots` of the paged caches [num_blocks, block_size, K, D]. per_head: one program per (token, head) instead
    of one per token; None = per head for decode-sized steps (<= PER_HEAD_MAX_TOKENS tokens), where one program
    per token leaves the GPU mostly idle (H200, 1.5B's 12 + 2 heads, 28 layers on their own buffers: 2.05 vs
    2.48 us at 8 tokens, 2.22 vs 2.59 at 64; 3.53 vs 3.38 at 256: benchmarks/results/long_tail/
    decode_kernels.json)."""
    triton, _, kernel, _ = _kernels()
    T, N, D = q_TND.shape
    K = k_TKD.shape[1]
    if D & (D - 1) or q_TND.stride(2) != 1 or k_TKD.stride(2) != 1 or v_TKD.stride(2) != 1:
        raise ValueError(f"rope_store_kv needs a power-of-two, contiguous head_dim; got D={D}")
    if per_head is None:
        per_head = T <= PER_HEAD_MAX_TOKENS
    if T and per_head:
        rope_store_head_kernel[(T, N + K)](
            q_TND, k_TKD, v_TKD, cos_TD, sin_TD, k_cache, v_cache, slots_T, q_TND.stride(0), q_TND.stride(1),
            k_TKD.stride(0), k_TKD.stride(1), v_TKD.stride(0), v_TKD.stride(1), cos_TD.stride(0), k_cache.stride(1),
            k_cache.stride(2), N, HALF=D // 2, num_warps=1)
    elif T:
        kernel[(T,)](q_TND, k_TKD, v_TKD, cos_TD, sin_TD, k_cache, v_cache, slots_T,
                     q_TND.stride(0), q_TND.stride(1), k_TKD.stride(0), k_TKD.stride(1), v_TKD.stride(0),
                     v_TKD.stride(1), cos_TD.stride(0), k_cache.stride(1), k_cache.stride(2), N, K,
                     NQ_PAD=triton.next_power_of_2(N), NK_PAD=triton.next_power_of_2(K), HALF=D // 2,
                     num_warps=4)


def silu_mul(gate_up_TI2, block: int = 512, num_warps: int = 4):
    """silu(gate) * up for gate_up = cat(gate, up) along the last dim; `block` columns per program. 512 x 4 warps
    was within 0.1 us of the best launch at 1-256 rows of the 1.5B's 8,960 columns (H200: 1.53 vs 3.59 us with 4,096
    columns a program at 8 rows, 4.98 vs 7.05 at 256; benchmarks/results/long_tail/decode_kernels.json)."""
    triton, _, _, kernel = _kernels()
    T, I2 = gate_up_TI2.shape
    I = I2 // 2  # noqa: E741
    y = torch.empty(T, I, dtype=gate_up_TI2.dtype, device=gate_up_TI2.device)
    block = min(block, triton.next_power_of_2(I))
    if T:
        kernel[(T, triton.cdiv(I, block))](gate_up_TI2, y, gate_up_TI2.stride(0), y.stride(0), I, BLOCK=block,
                                           num_warps=num_warps)
    return y
