"""A decoder layer's attention input side at small decode batch (1-16 rows): the current path's three kernels against
two fused Triton kernels (a benchmark-only experiment: the engine does not call these kernels).

The current path (models/decoder.py `_forward_fused` and `Attention.forward`) runs, per layer,
`fused.add_rmsnorm(h, residual, w_norm, eps)` (residual add, RMSNorm, the new residual written in place), the
cuBLAS qkv GEMM with its bias (`qkv_proj`: weight [(N + 2K) * D, H], q heads' rows, then k's, then v's) and
`fused.rope_store_kv` (RoPE on q and k, k and v stored into the paged caches at `slot_mapping`). At a few rows the
GEMM is a read of its weight (Qwen2.5-1.5B: 2048 x 1536 bf16 = 6.3 MB, ~1.7 µs at 3.8 TB/s), while the three
kernels took ~1.8 + 5.3 + 2.9 µs on an H200 at 8 rows.

The fused path, two kernels:
- `norm_qkv_partials`, grid (column blocks of the qkv output, K splits): every program computes the RMS statistic of
  its rows x = bf16(h + residual) over the whole hidden size itself (R x H, from L2 after the first programs), then
  normalises the K slice it multiplies with add_rmsnorm's roundings (bf16(x * rsqrt(mean(x^2) + eps)), then
  bf16(w_norm * that)) and writes the GEMV of that slice against its BLOCK_N x BLOCK_K weight tiles as fp32
  partials [S, R, (N + 2K) * D]. The statistic costs every program R x H x 4 bytes of L2 reads (`stats_l2_mb`
  below: 25 MB at 8 rows over 512 programs, against the 6.3 MB of weights), which is expected to limit this design
  at 8-16 rows and to favour tiles with fewer programs there (not measured yet).
- `qkv_reduce_rope_store`, grid (rows, q + k + v heads): sums its head's S partials in a fixed order
  (deterministic), adds the bias in fp32 and rounds once (F.linear's numerics, see `reference_qkv`), applies RoPE to
  q and k heads with rope_store_kv's roundings, writes q to [R, N, D] and k, v into the caches at slot_mapping[r]
  (rope_store_kv's addressing). It also writes the new residual bf16(h + residual), each program one chunk of its
  row: the residual cannot be written by the first kernel, whose other programs still read the old one (program
  (0, 0) writing it in place would race them); the second kernel starts after the first has finished reading.

Numerics: the same bf16 rounding points as the current path (the sum h + residual; x * rsqrt(var + eps); times the
norm weight; the GEMM output, with the bias added to the fp32 accumulator before its one rounding, as cuBLAS's bias
epilogue and torch's CPU addmm do; each RoPE product, then their sum). What differs is fp32 summation order: the
variance (BLOCK_K chunks here, one tl.sum over the row in add_rmsnorm) and the GEMV (K splits summed by the reduce,
against cuBLAS's own order and split-K), which moves a bf16 rounding by one ulp now and then. Under the Triton
interpreter at the tests' shapes every output equals the torch path's and the current kernels' bit for bit.

Status: checked on CPU under the Triton interpreter only (tests/rollout/test_fused_qkv_kernel.py); not yet compiled
or timed on a GPU.

Each tile is first checked against the current path on one layer (q, the new residual, both caches; relative error
under TOL; a failed or refused tile is recorded with its error, not timed). Then each variant runs a `layers`-deep
chain in one CUDA graph, every layer its own norm weight, qkv weight, bias and caches (so L2 holds no layer's
weights from one replay to the next). A layer's q feeds nothing here (attention, o_proj and the MLP are left out),
so the layers cannot chain through h: every layer reads the same h, and the residual buffer is updated in place
each layer as in the engine (it grows by h per layer; the norm rescales it). Reported: µs per layer for the current
path and for each tile, the best tile, and the byte floor (qkv weight bytes over the measured copy bandwidth);
`current_parts` times the three current kernels alone and `fused_parts` the two fused ones of the best tile.

  PYTHONPATH=. python benchmarks/decode_fused_qkv.py --model 1.5B --rows 1,4,8,16 --out decode_fused_qkv.json

Shape legend: R rows, H hidden, N q heads, K kv heads, D head_dim, S K splits, NQKV = (N + 2K) * D.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # the benchmark needs a GPU and Triton; on a CPU it only lists its tiles
    triton = tl = None

sys.path.insert(0, str(Path(__file__).parent))
from decode_gemm import (  # noqa: E402
    copy_bandwidth,
    gemm_shapes,
    graph_replay_us,
    rel_err,
    report_failed_tiles,
    tile_error,
    write_rows,
)
from rollout import SHAPES  # noqa: E402

from hybridrl.bench_manifest import device_facts  # noqa: E402
from hybridrl.models.decoder import RMSNorm  # noqa: E402
from hybridrl.models.rope import apply_rope  # noqa: E402

if triton is not None:
    from hybridrl.models.fused import _round, add_rmsnorm, rope_store_kv  # noqa: E402
    from hybridrl.models.fused_mlp import _dot  # noqa: E402

_jit = triton.jit if triton is not None else (lambda f: f)

MAX_ROWS = 64        # the [BLOCK_M, BLOCK_N] fp32 accumulator sits in registers (rows padded to tl.dot's 16)
TOL = 2e-2           # max |fused - current| / max |current| per output: see check()
SMS = 132            # H100 / H200 multiprocessors: the sweep's programs are about 1-4 waves of them
WEIGHT_SCALE = 0.5   # qkv weights ~ N(0, WEIGHT_SCALE^2 / H)
BIAS_SCALE = 0.5     # bias ~ N(0, BIAS_SCALE^2): Qwen2's k bias is large, this keeps it visible against x @ w.T
DEVICE = "cuda"      # measure_rows' device (the tests run its loop on the CPU under the interpreter)


@dataclass(frozen=True)
class Tile:
    block_n: int = 64   # qkv output columns per program
    block_k: int = 64   # hidden chunk of the statistic and of the GEMV
    split_k: int = 4    # K splits: programs = cdiv(NQKV, block_n) x split_k, and S partial slabs
    num_warps: int = 4
    num_stages: int = 3


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def k_per_split(h: int, tile: Tile) -> int:
    """Hidden columns per K split: cdiv(H, split_k) rounded up to whole BLOCK_K chunks (the last split may be
    shorter, and with too many splits the last ones empty: their partials are zeros)."""
    return _cdiv(_cdiv(h, tile.split_k), tile.block_k) * tile.block_k


def sweep(h: int, nqkv: int, sms: int = SMS) -> list[Tile]:
    """The tiles timed at one shape: block_n 32 / 64 / 128, block_k 64 / 128, splits such that every split holds
    columns (none empty) and column blocks x splits is 1-4 times `sms` (1.5B: 2048 columns over H = 1536; 7B:
    4608 over 3584, whose 7 x 512 splits are why 7 is among the split counts)."""
    tiles = []
    for bn in (32, 64, 128):
        for bk in (64, 128):
            for s in (1, 2, 3, 4, 6, 7, 8, 12, 16, 24):
                tile = Tile(block_n=bn, block_k=bk, split_k=s)
                programs = _cdiv(nqkv, bn) * s
                if _cdiv(h, k_per_split(h, tile)) == s and sms <= programs <= 4 * sms:
                    tiles.append(tile)
    return tiles


def model_shape(model: str) -> tuple[int, int, int, int]:
    """(H, N, K, D) of a Qwen2.5 model from benchmarks/rollout.py's SHAPES."""
    h, _inter, _layers, heads, kv, _tied = SHAPES[model]
    d = h // heads
    assert gemm_shapes(model)["qkv"] == ((heads + 2 * kv) * d, h)
    return h, heads, kv, d


@_jit
def _sum_rows(X, RES, offs_m, m_ok, offs_k, k_ok, s_x, s_r, HAS_RES: tl.constexpr):
    """x = h + residual on rows offs_m, columns offs_k, in fp32 holding add_rmsnorm's bf16 sum (zeros where
    masked)."""
    mask = m_ok[:, None] & k_ok[None, :]
    x = tl.load(X + offs_m[:, None] * s_x + offs_k[None, :], mask=mask, other=0.0)
    xf = x.to(tl.float32)
    if HAS_RES:
        r = tl.load(RES + offs_m[:, None] * s_r + offs_k[None, :], mask=mask, other=0.0)
        xf = _round(xf + r.to(tl.float32), X.dtype.element_ty)
    return xf


@_jit
def norm_qkv_partials(X, RES, NW, W, PART, Y, R, s_x, s_r, s_w, eps,
                      H: tl.constexpr, NQKV: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_RES: tl.constexpr, STORE_Y: tl.constexpr,
                      UPCAST: tl.constexpr):
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    dt = X.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < R  # rows past R (padding up to tl.dot's 16) load zeros and are never stored
    # the row statistic over the whole hidden size: every program computes it (no grid-wide sync in one kernel)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        xf = _sum_rows(X, RES, offs_m, m_ok, offs_k, offs_k < H, s_x, s_r, HAS_RES)
        ss += tl.sum(xf * xf, axis=1)
    rstd = tl.rsqrt(ss / H + eps)  # add_rmsnorm's var = sum / H, rsqrt(var + eps)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < NQKV
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, K_SPLIT, BLOCK_K):  # this split's slice, normalised, times its weight tiles
        offs_k = s * K_SPLIT + kk + tl.arange(0, BLOCK_K)
        k_ok = offs_k < H
        xf = _sum_rows(X, RES, offs_m, m_ok, offs_k, k_ok, s_x, s_r, HAS_RES)
        nw = tl.load(NW + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        y = _round(nw[None, :] * _round(xf * rstd[:, None], dt), dt).to(dt)  # exact: already a bf16 value
        if STORE_Y:  # for the tests: the normed rows this split multiplied (column block 0 writes them)
            if pid_n == 0:
                tl.store(Y + offs_m[:, None] * H + offs_k[None, :], y, mask=m_ok[:, None] & k_ok[None, :])
        w = tl.load(W + offs_n[:, None] * s_w + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(y, tl.trans(w), acc, UPCAST)
    tl.store(PART + s * R * NQKV + offs_m[:, None] * NQKV + offs_n[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


@_jit
def qkv_reduce_rope_store(PART, BIAS, X, RES, COS, SIN, Q, KC, VC, SLOT, R, S, s_x, s_r, s_cos, s_sin, s_qt, s_qh,
                          s_cs, s_ch, H: tl.constexpr, NQ: tl.constexpr, NK: tl.constexpr, HALF: tl.constexpr,
                          S_PAD: tl.constexpr, BLOCK_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
                          HAS_RES: tl.constexpr):
    r = tl.program_id(0)
    hd = tl.program_id(1)  # q heads, then k heads, then v heads: the qkv weight's row order
    dt = Q.dtype.element_ty
    NQKV = (NQ + 2 * NK) * 2 * HALF  # constexpr arithmetic
    d1 = tl.arange(0, HALF)
    d2 = d1 + HALF
    offs_s = tl.arange(0, S_PAD)
    s_ok = (offs_s < S)[:, None]
    # the S partials of this head's columns, summed by tl.sum's fixed tree: the same bits on every call
    base = PART + offs_s[:, None] * (R * NQKV) + r * NQKV + hd * (2 * HALF)
    a1 = tl.sum(tl.load(base + d1[None, :], mask=s_ok, other=0.0), axis=0)
    a2 = tl.sum(tl.load(base + d2[None, :], mask=s_ok, other=0.0), axis=0)
    if HAS_BIAS:  # F.linear with a bias: added to the fp32 accumulator, then one rounding (cuBLAS's epilogue)
        a1 += tl.load(BIAS + hd * (2 * HALF) + d1).to(tl.float32)
        a2 += tl.load(BIAS + hd * (2 * HALF) + d2).to(tl.float32)
    y1 = _round(a1, dt)  # the GEMM's bf16 output
    y2 = _round(a2, dt)
    if hd < NQ + NK:  # RoPE with rope_store_kv's roundings (fused._rot): each product, then the sum
        c1 = tl.load(COS + r * s_cos + d1).to(tl.float32)
        c2 = tl.load(COS + r * s_cos + d2).to(tl.float32)
        s1 = tl.load(SIN + r * s_sin + d1).to(tl.float32)
        s2 = tl.load(SIN + r * s_sin + d2).to(tl.float32)
        o1 = _round(_round(y1 * c1, dt) - _round(y2 * s1, dt), dt).to(dt)
        o2 = _round(_round(y2 * c2, dt) + _round(y1 * s2, dt), dt).to(dt)
        if hd < NQ:
            tl.store(Q + r * s_qt + hd * s_qh + d1, o1)
            tl.store(Q + r * s_qt + hd * s_qh + d2, o2)
        else:
            cbase = tl.load(SLOT + r).to(tl.int64) * s_cs + (hd - NQ) * s_ch
            tl.store(KC + cbase + d1, o1)
            tl.store(KC + cbase + d2, o2)
    else:
        cbase = tl.load(SLOT + r).to(tl.int64) * s_cs + (hd - NQ - NK) * s_ch
        tl.store(VC + cbase + d1, y1.to(dt))
        tl.store(VC + cbase + d2, y2.to(dt))
    if HAS_RES:  # the new residual, add_rmsnorm's bf16(h + residual): this program's chunk of row r
        offs_h = hd * BLOCK_RES + tl.arange(0, BLOCK_RES)
        h_ok = offs_h < H
        x = tl.load(X + r * s_x + offs_h, mask=h_ok, other=0.0).to(tl.float32)
        res = tl.load(RES + r * s_r + offs_h, mask=h_ok, other=0.0).to(tl.float32)
        tl.store(RES + r * s_r + offs_h, _round(x + res, dt).to(dt), mask=h_ok)


def _pow2(name: str, value: int, least: int) -> None:
    if value < least or value & (value - 1):
        raise ValueError(f"fused_qkv: {name}={value} must be a power of two >= {least}")


def _check_inputs(h, residual, norm_w, w_qkv, tile: Tile) -> tuple[int, int, int]:
    if h.dim() != 2 or h.dtype not in (torch.bfloat16, torch.float16) or h.stride(1) != 1:
        raise ValueError(f"fused_qkv: h must be a 16-bit [R, H], contiguous along H; got {tuple(h.shape)} {h.dtype}")
    R, H = h.shape
    if residual is not None and (residual.shape != h.shape or residual.dtype != h.dtype or residual.stride(1) != 1):
        raise ValueError(f"fused_qkv: residual must be like h {tuple(h.shape)}, got {tuple(residual.shape)}")
    if tuple(norm_w.shape) != (H,) or not norm_w.is_contiguous():
        raise ValueError(f"fused_qkv: the norm weight must be a contiguous [{H}], got {tuple(norm_w.shape)}")
    if w_qkv.dim() != 2 or w_qkv.shape[1] != H or w_qkv.dtype != h.dtype or w_qkv.stride(1) != 1:
        raise ValueError(f"fused_qkv: w_qkv must be [NQKV, {H}] in {h.dtype}, contiguous along H; got "
                         f"{tuple(w_qkv.shape)} {w_qkv.dtype}")
    if R > MAX_ROWS:
        raise ValueError(f"fused_qkv serves at most {MAX_ROWS} rows, got {R}")
    _pow2("block_n", tile.block_n, 16)  # tl.dot's operands
    _pow2("block_k", tile.block_k, 16)
    if tile.split_k < 1:
        raise ValueError(f"fused_qkv: split_k={tile.split_k} must be >= 1")
    return R, H, w_qkv.shape[0]


def qkv_partials(h, residual, norm_w, eps: float, w_qkv, tile: Tile = Tile(),
                 y_out: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 partials [S, R, NQKV] of rmsnorm(h + residual) * norm_w @ w_qkv.T, slab s from hidden columns
    [s * k_per_split, (s + 1) * k_per_split). Reads, never writes, residual. y_out ([R, H], h's dtype), if given,
    receives the normed rows the GEMV multiplied."""
    R, H, nqkv = _check_inputs(h, residual, norm_w, w_qkv, tile)
    part = torch.empty(tile.split_k, R, nqkv, dtype=torch.float32, device=h.device)
    if y_out is not None and (tuple(y_out.shape) != (R, H) or not y_out.is_contiguous() or y_out.dtype != h.dtype):
        raise ValueError(f"qkv_partials: y_out must be a contiguous [{R}, {H}] {h.dtype}, got {tuple(y_out.shape)}")
    if R:
        res = residual if residual is not None else h
        norm_qkv_partials[(triton.cdiv(nqkv, tile.block_n), tile.split_k)](
            h, res, norm_w, w_qkv, part, y_out if y_out is not None else h, R, h.stride(0), res.stride(0),
            w_qkv.stride(0), eps, H=H, NQKV=nqkv, K_SPLIT=k_per_split(H, tile),
            BLOCK_M=max(16, triton.next_power_of_2(R)), BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
            HAS_RES=residual is not None, STORE_Y=y_out is not None, UPCAST=not h.is_cuda,
            num_warps=tile.num_warps, num_stages=tile.num_stages)
    return part


def reduce_rope_store(part, b_qkv, h, residual, cos, sin, k_cache, v_cache, slots) -> torch.Tensor:
    """Sum the partials, add the bias, RoPE q and k, store k and v at `slots` of the caches [num_blocks,
    block_size, K, D], write bf16(h + residual) into residual (if given) -> q [R, N, D]."""
    S, R, nqkv = part.shape
    H = h.shape[1]
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"fused_qkv: the caches must be two alike [num_blocks, block_size, K, D], got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("fused_qkv: the caches must be contiguous (slot * stride(1) addresses a token)")
    K, D = k_cache.shape[2:]
    _pow2("head_dim", D, 4)
    N = nqkv // D - 2 * K
    if nqkv % D or N < 1:
        raise ValueError(f"fused_qkv: {nqkv} qkv columns are not N q heads and {K} + {K} kv heads of {D}")
    if tuple(h.shape) != (R, H) or (residual is not None and tuple(residual.shape) != (R, H)):
        raise ValueError(f"fused_qkv: h and residual must be [{R}, H] like the partials' rows")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[0] != R or t.shape[1] != D or t.stride(1) != 1:
            raise ValueError(f"fused_qkv: {name} must be [{R}, {D}], contiguous along D; got {tuple(t.shape)}")
    if tuple(slots.shape) != (R,) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fused_qkv: slots must be [{R}] integers, got {tuple(slots.shape)} {slots.dtype}")
    if b_qkv is not None and (tuple(b_qkv.shape) != (nqkv,) or not b_qkv.is_contiguous()):
        raise ValueError(f"fused_qkv: the bias must be a contiguous [{nqkv}], got {tuple(b_qkv.shape)}")
    q = torch.empty(R, N, D, dtype=h.dtype, device=h.device)
    if R:
        res = residual if residual is not None else h
        qkv_reduce_rope_store[(R, N + 2 * K)](
            part, b_qkv if b_qkv is not None else part, h, res, cos, sin, q, k_cache, v_cache, slots, R, S,
            h.stride(0), res.stride(0), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1), k_cache.stride(1),
            k_cache.stride(2), H=H, NQ=N, NK=K, HALF=D // 2, S_PAD=max(2, triton.next_power_of_2(S)),
            BLOCK_RES=triton.next_power_of_2(triton.cdiv(H, N + 2 * K)), HAS_BIAS=b_qkv is not None,
            HAS_RES=residual is not None, num_warps=1 if D <= 128 else 2)
    return q


def fused_qkv(h, residual, norm_w, eps: float, w_qkv, b_qkv, cos, sin, k_cache, v_cache, slots,
              tile: Tile = Tile()) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention input side in two kernels -> (q [R, N, D], new residual). The new residual bf16(h + residual)
    is written into `residual` in place (with residual None it is h itself), k and v land in the caches."""
    part = qkv_partials(h, residual, norm_w, eps, w_qkv, tile)
    q = reduce_rope_store(part, b_qkv, h, residual, cos, sin, k_cache, v_cache, slots)
    return q, residual if residual is not None else h


def _split_heads(qkv, k_cache):
    R = qkv.shape[0]
    K, D = k_cache.shape[2:]
    q, k, v = qkv.split([qkv.shape[1] - 2 * K * D, K * D, K * D], dim=-1)
    return q.view(R, -1, D), k.view(R, K, D), v.view(R, K, D)


def reference_qkv(h, residual, norm_w, eps: float, w_qkv, b_qkv, cos, sin, k_cache, v_cache, slots):
    """The current path's numerics with the torch pieces the engine falls back to where the fused kernels do not run
    (the CPU): h + residual in h's dtype (written into residual in place, as add_rmsnorm does), models/decoder.py's
    RMSNorm, F.linear with the bias (on CUDA and on the CPU the bias is added to the fp32 accumulator and the sum
    rounded once), models/rope.py's apply_rope on q and k (bf16 products, then their bf16 sum) and
    rollout/attention.py's index_copy_ of k and v at `slots` -> (q [R, N, D], new residual)."""
    x = h if residual is None else residual.copy_(h + residual)
    norm = RMSNorm(h.shape[1], eps).to(h.device)
    norm.weight.data = norm_w
    q, k, v = _split_heads(F.linear(norm(x), w_qkv, b_qkv), k_cache)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    K, D = k_cache.shape[2:]
    k_cache.view(-1, K, D).index_copy_(0, slots, k)
    v_cache.view(-1, K, D).index_copy_(0, slots, v.contiguous())
    return q, x


def current_qkv(h, residual, norm_w, eps: float, w_qkv, b_qkv, cos, sin, k_cache, v_cache, slots):
    """The engine's current fused path: fused.add_rmsnorm, cuBLAS F.linear with the bias, fused.rope_store_kv on the
    views of the qkv output (q rotated in place) -> (q [R, N, D], new residual)."""
    x, res = add_rmsnorm(h, residual, norm_w, eps)
    q, k, v = _split_heads(F.linear(x, w_qkv, b_qkv), k_cache)
    rope_store_kv(q, k, v, cos, sin, k_cache, v_cache, slots)
    return q, res


# ---------------------------------------------------------------------------------------------------- the benchmark


def rope_tables(rows: int, d: int, device, theta: float = 1e6, max_pos: int = 4096, seed: int = 0):
    """cos, sin [rows, D] in bf16 at random positions (Qwen2.5's rope theta), as the engine indexes them."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, max_pos, (rows,), generator=g).float()
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    emb = torch.cat([torch.outer(pos, inv)] * 2, dim=-1)
    return emb.cos().bfloat16().to(device), emb.sin().bfloat16().to(device)


def layer_inputs(h: int, n: int, k: int, d: int, rows: int, layers: int, device="cuda", block_size: int = 16):
    """Per layer: norm weight, qkv weight, bias, k cache, v cache (each layer its own); the slots, shared."""
    nqkv = (n + 2 * k) * d
    blocks = -(-rows // block_size) + 1
    g = torch.Generator(device=device).manual_seed(1)  # drawn on the device: a 7B's 28 qkv weights are 462M values

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    out = [((1 + 0.1 * randn(h)).bfloat16(), (randn(nqkv, h) * (WEIGHT_SCALE / h ** 0.5)).bfloat16(),
            (randn(nqkv) * BIAS_SCALE).bfloat16(),
            torch.zeros(blocks, block_size, k, d, dtype=torch.bfloat16, device=device),
            torch.zeros(blocks, block_size, k, d, dtype=torch.bfloat16, device=device)) for _ in range(layers)]
    slots = torch.randperm(blocks * block_size, generator=g, device=device)[:rows]
    return out, slots


def check(h, residual, layer, eps, cos, sin, slots, tile: Tile) -> float:
    """max over q, the new residual and both caches of |fused - current| / max |current|; raises over TOL. The two
    round at the same points and differ in fp32 summation order (the variance, the GEMV), which moves a bf16
    rounding now and then by one ulp (2^-8 relative): ~1e-2 of the largest value at most. A wrong mask, slice,
    head or slot gives O(1)."""
    norm_w, w, b, kc, vc = layer
    cur = [t.clone() for t in (residual, kc, vc)]
    fus = [t.clone() for t in (residual, kc, vc)]
    q_ref, _ = current_qkv(h, cur[0], norm_w, eps, w, b, cos, sin, cur[1], cur[2], slots)
    q, _ = fused_qkv(h, fus[0], norm_w, eps, w, b, cos, sin, fus[1], fus[2], slots, tile)
    errs = [rel_err(q, q_ref)] + [rel_err(a, c) for a, c in zip(fus, cur)]
    if not max(errs) <= TOL:  # NaN fails too
        raise AssertionError(f"fused_qkv {tuple(h.shape)} {asdict(tile)}: relative errors (q, residual, k, v) "
                             f"{errs} over {TOL}")
    return max(errs)


def chain(fn, h, residual, layers, eps, cos, sin, slots):
    """fn over every layer's weights and caches, each layer reading the same h and the residual it updates."""
    q = None
    for norm_w, w, b, kc, vc in layers:
        q, _ = fn(h, residual, norm_w, eps, w, b, cos, sin, kc, vc, slots)
    return q


def time_parts(parts: dict, n_layers: int) -> dict:
    """Each kernel of a path alone over every layer in one CUDA graph: µs per layer, or the error that stopped it."""
    out = {}
    for name, fn in parts.items():
        try:
            out[name] = graph_replay_us(fn, reps=20)[0] / n_layers
        except Exception as e:
            out[name] = tile_error(e)
    return out


def measure_rows(m: int, H: int, N: int, K: int, D: int, tiles: list[Tile], n_layers: int, eps: float,
                 floor_us: float) -> dict:
    """One row count: the current path, its three kernels alone, every tile (checked first), and the best tile's
    two kernels alone, as µs per layer of an n_layers chain in one CUDA graph."""
    nqkv = (N + 2 * K) * D
    layers, slots = layer_inputs(H, N, K, D, m, n_layers, DEVICE)
    cos, sin = rope_tables(m, D, DEVICE)
    h = torch.randn(m, H, device=DEVICE, dtype=torch.bfloat16)
    residual = torch.randn(m, H, device=DEVICE, dtype=torch.bfloat16)
    rec, entries = {"floor_us_per_layer": floor_us}, []

    def run(fn):  # a fresh residual buffer for every variant (each chain updates its own in place)
        return partial(chain, fn, h, residual.clone(), layers, eps, cos, sin, slots)

    us, _ = graph_replay_us(run(current_qkv), reps=20)
    rec["current_us_per_layer"] = us / n_layers
    qkvs = [torch.randn(m, nqkv, device=DEVICE, dtype=torch.bfloat16) for _ in layers]
    res_c = residual.clone()
    parts = {"add_rmsnorm": lambda: [add_rmsnorm(h, res_c, w[0], eps) for w in layers],
             "qkv_linear": lambda: [F.linear(h, w[1], w[2]) for w in layers],
             "rope_store_kv": lambda: [rope_store_kv(*_split_heads(qkv, w[3]), cos, sin, w[3], w[4], slots)
                                       for qkv, w in zip(qkvs, layers)]}
    rec["current_parts_us_per_layer"] = time_parts(parts, n_layers)
    best = None
    for tile in tiles:
        programs = triton.cdiv(nqkv, tile.block_n) * tile.split_k
        entry = {"tile": asdict(tile), "programs": programs,
                 "partials_mb": tile.split_k * m * nqkv * 4 / 1e6,
                 "stats_l2_mb": programs * m * H * 2 * 2 / 1e6}
        try:
            entry["rel_err"] = check(h, residual, layers[0], eps, cos, sin, slots, tile)
            us, q = graph_replay_us(run(partial(fused_qkv, tile=tile)), reps=20)
            entry["us_per_layer"] = us / n_layers
            entry["q_finite"] = bool(torch.isfinite(q).all())
            if entry["q_finite"] and (best is None or us < best[0]):
                best = (us, tile)
        except Exception as e:  # a tile the compiler refuses (shared memory, registers), or a failed check
            entry["error"] = tile_error(e)
        entries.append(entry)
    if best is not None:
        tile = best[1]
        rec["best_tile"] = asdict(tile)
        rec["fused_us_per_layer"] = best[0] / n_layers
        parts_ = [qkv_partials(h, residual, w[0], eps, w[1], tile) for w in layers]
        fused_parts = {
            "norm_qkv_partials": lambda: [qkv_partials(h, residual, w[0], eps, w[1], tile) for w in layers],
            "qkv_reduce_rope_store": lambda: [reduce_rope_store(pt, w[2], h, res_c, cos, sin, w[3], w[4], slots)
                                              for pt, w in zip(parts_, layers)]}
        rec["fused_parts_us_per_layer"] = time_parts(fused_parts, n_layers)
    return rec | {"tiles": entries}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="1.5B", choices=["1.5B", "7B"])
    p.add_argument("--rows", default="1,4,8,16")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--out", default="decode_fused_qkv.json")
    args = p.parse_args(argv)
    H, N, K, D = model_shape(args.model)
    nqkv = (N + 2 * K) * D
    tiles = sweep(H, nqkv)
    if triton is None or not torch.cuda.is_available():
        print(f"decode_fused_qkv needs a CUDA GPU and Triton; at {args.model} (H={H}, N={N}, K={K}, D={D}) it "
              f"would sweep {len(tiles)} tiles:")
        for t in tiles:
            print(" ", asdict(t), f"programs={_cdiv(nqkv, t.block_n) * t.split_k}")
        return
    t0 = time.time()
    torch.manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    if max(rows) > MAX_ROWS:
        raise SystemExit(f"--rows: fused_qkv serves at most {MAX_ROWS} rows")
    eps = 1e-6
    bw = copy_bandwidth()
    weight_bytes = nqkv * H * 2
    floor_us = weight_bytes / bw * 1e6
    result = {"benchmark": "decode_fused_qkv", "command": " ".join([sys.executable, *sys.argv]),
              "device": device_facts(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_gb_per_s": bw / 1e9, "model": args.model, "hidden": H, "q_heads": N, "kv_heads": K,
              "head_dim": D, "layers": args.layers, "qkv_weight_mb": weight_bytes / 1e6,
              "floor_us_per_layer": floor_us, "tolerance": TOL, "rows": {}}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for m in rows:
        write_rows(out_path, result, m, measure_rows(m, H, N, K, D, tiles, args.layers, eps, floor_us), t0)
    report_failed_tiles(out_path, result)


if __name__ == "__main__":
    main()
