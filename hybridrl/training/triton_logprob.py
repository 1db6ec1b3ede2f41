"""Triton kernels for one chunk of the fused log-prob head: the chunk's raw logits z [K, V] (bf16 or fp16, as the
head GEMM writes them, row-major) in, per-row log-sum-exp / target log-prob / entropy of z / T out (forward), and
the logits' gradient written over z (backward). algorithms/chunked_logprob.py calls them for a source that offers
raw chunks (`_HeadLogits` on CUDA); its torch formulas for finite logits are the reference:
  x = z / T,  lse = logsumexp(x),  log p_t = x_t - lse,  H = lse - sum_j p_j x_j,
  dz = (g_lp * (onehot(t) - p) - g_H * p * (log p + H)) / T,  p = exp(x - lse).

Choices:
- Why: the torch formulas make about ten passes over each chunk in fp32 (the upcast, logsumexp's, exp, the dz
  algebra, scatter_add, the downcast): ~45 ms of a 16k-token micro-batch at a 152k vocabulary on an H200. Here
  forward reads the bf16 chunk once and backward reads and writes it once; both compute in fp32.
- x = z * (1 / T) with the reciprocal rounded to fp32 first: what torch's CUDA division by a Python scalar does
  (`z.div_(T)` in the torch path), so x is the same number on both paths; the upstream gradients are scaled the
  same way.
- Forward: one program a row walks V in tiles with an online max m and rescaled sums s = sum exp(x - m) and
  w = sum exp(x - m) * x (w / s = sum p x), one exp an entry; only the tile's max and sums cross lanes.
- Backward: the row's lse and H are known, so every (row, tile) is independent: a 2-D grid of programs, each
  reading its tile, forming dz in the same operation order as the torch path and storing it in z's dtype (z is
  recomputed for backward and dead afterwards, so no second buffer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096   # vocabulary entries a tile: 8 KiB of bf16 logits


@triton.jit
def _forward_kernel(Z, TGT, LSE, LOGP, ENT, s_z, V, inv_t, HAS_TARGET: tl.constexpr, WITH_ENTROPY: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    w = s
    for start in range(0, V, BLOCK):
        idx = start + cols
        live = idx < V
        x = tl.load(Z + row * s_z + idx, mask=live, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, tl.max(x, 0))   # finite: every tile has a live entry
        alpha = tl.exp(m - m_new)             # exp(-inf) = 0 on the first tile
        e = tl.exp(x - m_new)                 # 0 on dead lanes
        s = s * alpha + tl.sum(e, 0)
        if WITH_ENTROPY:
            w = w * alpha + tl.sum(e * tl.where(live, x, 0.0), 0)   # 0 * 0 on dead lanes, not 0 * -inf
        m = m_new
    lse = m + tl.log(s)
    tl.store(LSE + row, lse)
    if HAS_TARGET:
        t = tl.load(TGT + row)
        tl.store(LOGP + row, tl.load(Z + row * s_z + t).to(tl.float32) * inv_t - lse)
    if WITH_ENTROPY:
        tl.store(ENT + row, lse - tl.math.div_rn(w, s))   # once a row: IEEE division, not the approximate `/`


@triton.jit
def _backward_kernel(Z, TGT, LSE, ENT, G_LP, G_H, s_z, V, inv_t, HAS_LOG_P: tl.constexpr, HAS_ENTROPY: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = idx < V
    ptr = Z + row * s_z + idx
    log_p = tl.load(ptr, mask=live, other=0.0).to(tl.float32) * inv_t - tl.load(LSE + row)
    p = tl.exp(log_p)
    if HAS_LOG_P:
        g_lp = tl.load(G_LP + row) * inv_t
    if HAS_ENTROPY:
        dz = (log_p + tl.load(ENT + row)) * -(tl.load(G_H + row) * inv_t)
        if HAS_LOG_P:
            dz = dz - g_lp
        dz = dz * p
    else:
        dz = p * -g_lp
    if HAS_LOG_P:
        dz = tl.where(idx == tl.load(TGT + row), dz + g_lp, dz)
    tl.store(ptr, dz.to(Z.dtype.element_ty), mask=live)


def _reciprocal(temperature: float) -> float:
    """1 / T rounded to fp32, as torch's CUDA kernels scale by a Python-scalar divisor."""
    return torch.tensor(temperature, dtype=torch.float32).reciprocal().item()


def _check(z: torch.Tensor) -> None:
    if z.dim() != 2 or z.stride(1) != 1 or z.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"expected row-major [K, V] bf16/fp16 logits, got {z.dtype} {tuple(z.shape)} "
                         f"strides {z.stride()}")


def logprob_entropy_forward(z: torch.Tensor, targets: torch.Tensor | None, temperature: float,
                            lse: torch.Tensor, log_p: torch.Tensor, entropy: torch.Tensor | None) -> None:
    """Fills lse [K], log_p [K] (when targets [K] are given) and entropy [K] (when given), all fp32, from the raw
    logits z [K, V]: of z / temperature. Targets must lie in [0, V): unchecked, which would take a device sync."""
    _check(z)
    k, v = z.shape
    _forward_kernel[(k,)](   # lse in place of absent tensors: pointers never read
        z, lse if targets is None else targets.contiguous(), lse, log_p, lse if entropy is None else entropy,
        z.stride(0), v, _reciprocal(temperature), HAS_TARGET=targets is not None, WITH_ENTROPY=entropy is not None,
        BLOCK=min(BLOCK, triton.next_power_of_2(v)), num_warps=8)


def logprob_entropy_backward(z: torch.Tensor, targets: torch.Tensor | None, lse: torch.Tensor,
                             entropy: torch.Tensor, grad_log_p: torch.Tensor | None,
                             grad_entropy: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """Overwrites the raw logits z [K, V] with the gradient of the undivided logits (z's dtype) and returns it,
    given forward's lse and entropy [K] and the rows' upstream gradients: grad_log_p [K] with targets [K] (or
    both None: no log-prob term), grad_entropy [K] (or None: no entropy term). At least one term is needed."""
    _check(z)
    if grad_log_p is None and grad_entropy is None:
        raise ValueError("no gradient to propagate: neither grad_log_p nor grad_entropy")
    k, v = z.shape
    block = min(BLOCK, triton.next_power_of_2(v))
    # upstream gradients may be broadcast views (a sum's backward): a contiguous fp32 copy of K numbers
    g_lp, g_h = (None if g is None else g.float().contiguous() for g in (grad_log_p, grad_entropy))
    _backward_kernel[(k, triton.cdiv(v, block))](   # lse in place of absent tensors: pointers never read
        z, lse if targets is None else targets.contiguous(), lse, entropy, lse if g_lp is None else g_lp,
        lse if g_h is None else g_h, z.stride(0), v, _reciprocal(temperature), HAS_LOG_P=g_lp is not None,
        HAS_ENTROPY=g_h is not None, BLOCK=block, num_warps=8)
    return z
