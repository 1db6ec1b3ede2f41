"""The decoder MLP at decode batch as one Triton kernel plus a small reduce (the rollout engine's fused path, from
models/decoder.py's MLP for at most ENGINE_MAX_ROWS rows).

`fused_mlp_partials` gives each program a slice of BLOCK_I intermediate columns: the gate and up GEMVs for those
columns (fp32 accumulation over the hidden size in BLOCK_K chunks; rows padded to tl.dot's 16 with masks),
h = silu(gate) * up with the unfused path's bf16 roundings (cuBLAS's bf16 gate|up, then models/fused.silu_mul's), and
that slice's share of the down projection, [R, H] in fp32, written to partials[p]. `reduce_partials` sums the
P = cdiv(I, BLOCK_I) partials in a fixed order (no atomics: the same bits on every call), rounds to the activation
dtype and optionally adds a residual as the unfused path does. Weights are read once; the price is the fp32
partials, P * R * H * 4 bytes written and read back, which is why it serves small batches only.

Why: at a few rows a layer's MLP is a read of its weights, but the unfused path (cuBLAS gate|up, silu_mul, cuBLAS
down with its own split-K reduce) pays each kernel's fixed cost. On one H100 (1.5B, 28 layers on distinct weights
in a CUDA graph, benchmarks/decode_fused_mlp.py) the fused MLP took 34.1 / 35.3 / 36.6 / 39.2 us a layer at
1 / 4 / 8 / 16 rows against 39.0 / 39.4 / 39.9 / 40.6 unfused (floor 27.3), and 46.7 against 42.1 at 32 rows
(benchmarks/results/long_tail/decode_fused_mlp_1.5b*.json); DECODE_TILE was the best tile at every row count.
`HYBRIDRL_FUSED_MLP=0` keeps the unfused path (A/B runs).

Shape legend: R rows, H hidden, I intermediate (this rank's), P partial slabs.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridrl.models.fused import _round, triton

if triton is not None:
    import triton.language as tl

_jit = triton.jit if triton is not None else (lambda f: f)
# the row count R is a runtime argument Triton does not specialise on (by default it would compile R == 1 and
# R % 16 == 0 apart): one partials kernel for every graph bucket of <= ENGINE_MAX_ROWS rows, and one reduce per
# column block (reduce_block_h: two across those buckets at the 1.5B's width)
_jit_rows = triton.jit(do_not_specialize=["R"]) if triton is not None else (lambda f: f)

MAX_ROWS = 64          # acc_gate and acc_up are [BLOCK_M, BLOCK_I] fp32 in registers: more rows would spill
ENGINE_MAX_ROWS = 16   # where the engine takes it: 0.87-0.96x the unfused path at 1-16 rows, 1.11x at 32
REDUCE_TILE = 4096     # partials elements one reduce program loads at once (BLOCK_P x BLOCK_H)
REDUCE_PROGRAMS = 256  # the reduce narrows its column blocks until about this many programs run


@dataclass(frozen=True)
class Tile:
    block_i: int = 64   # intermediate columns per program: P = cdiv(I, block_i) programs and partial slabs
    block_k: int = 128  # hidden (K) chunk of the gate/up GEMVs
    block_h: int = 64   # hidden (output) chunk of the down projection
    num_warps: int = 4
    num_stages: int = 3


DECODE_TILE = Tile(block_i=128, block_k=128, block_h=128, num_warps=4, num_stages=3)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def serves(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether the engine's MLP runs fused here: switched on (HYBRIDRL_FUSED_MLP), 1..ENGINE_MAX_ROWS rows, 16-bit
    activations and weights of x's dtype, contiguous along their last dim, and on a GPU its slices one wave of
    programs: a second, partial wave would add a whole slice's time (measured where they fit: the 1.5B's 70
    slices; a 7B's 148 at TP = 1 exceed an H100's 132 SMs and keep the unfused path)."""
    # the row count first: at larger batches (eager steps, where this runs every layer) it is the one check made
    return (0 < x.shape[0] <= ENGINE_MAX_ROWS and os.environ.get("HYBRIDRL_FUSED_MLP", "1") != "0"
            and triton is not None and x.dtype in (torch.bfloat16, torch.float16)
            and w_gate_up.dtype == x.dtype == w_down.dtype
            and x.stride(-1) == 1 and w_gate_up.stride(-1) == 1 and w_down.stride(-1) == 1
            and (not x.is_cuda or one_wave(w_down.shape[1], _sm_count(x.device))))


def one_wave(intermediate: int, sms: int, tile: Tile = DECODE_TILE) -> bool:
    """Whether the MLP's slices of `intermediate` columns (this rank's) run as one wave of programs on `sms` SMs."""
    return -(-intermediate // tile.block_i) <= sms


@_jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b. UPCAST (CPU only): the Triton interpreter (3.9) multiplies bf16 tl.dot operands as their raw
    uint16 bits, so there they go in as fp32, which is exact (a product of two bf16 values fits fp32's mantissa)
    and leaves the fp32 accumulation as on the GPU's tensor cores."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@_jit_rows
def fused_mlp_partials(X, WGU, WD, PART, HOUT, R, s_x, s_wgu, s_wd,
                       H: tl.constexpr, I: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, STORE_H: tl.constexpr, UPCAST: tl.constexpr):
    p = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < R  # rows past R (padding up to tl.dot's 16) load zeros and are never stored
    offs_i = p * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = offs_i < I  # the last slice may be partial: its dead columns get zero weights, so h = 0 there
    acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_ok = offs_k < H
        x = tl.load(X + offs_m[:, None] * s_x + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = i_ok[:, None] & k_ok[None, :]
        wg = tl.load(WGU + offs_i[:, None] * s_wgu + offs_k[None, :], mask=w_ok, other=0.0)
        wu = tl.load(WGU + (offs_i + I)[:, None] * s_wgu + offs_k[None, :], mask=w_ok, other=0.0)
        acc_g = _dot(x, tl.trans(wg), acc_g, UPCAST)
        acc_u = _dot(x, tl.trans(wu), acc_u, UPCAST)
    # the current path's roundings: gate|up leave cuBLAS in bf16, silu_mul rounds silu(gate) and then the product
    g = _round(acc_g, X.dtype.element_ty)
    u = _round(acc_u, X.dtype.element_ty)
    act = _round(g / (1.0 + tl.exp(-g)), X.dtype.element_ty)
    hid = _round(act * u, X.dtype.element_ty).to(X.dtype.element_ty)  # exact: already a bf16 value
    if STORE_H:  # for the tests: the h this program fed to the down projection
        tl.store(HOUT + offs_m[:, None] * I + offs_i[None, :], hid, mask=m_ok[:, None] & i_ok[None, :])
    for c in range(0, H, BLOCK_H):
        offs_h = c + tl.arange(0, BLOCK_H)
        h_ok = offs_h < H
        wd = tl.load(WD + offs_h[:, None] * s_wd + offs_i[None, :], mask=h_ok[:, None] & i_ok[None, :], other=0.0)
        part = _dot(hid, tl.trans(wd), tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32), UPCAST)
        tl.store(PART + p * R * H + offs_m[:, None] * H + offs_h[None, :], part, mask=m_ok[:, None] & h_ok[None, :])


@_jit_rows
def reduce_partials(PART, RES, OUT, R, P, s_res, s_out, H: tl.constexpr, BLOCK_P: tl.constexpr,
                    BLOCK_H: tl.constexpr, HAS_RES: tl.constexpr):
    r = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    # BLOCK_P slabs at a time (their loads in flight together), in ascending order, each chunk by tl.sum's fixed
    # tree: the same order on every call, so the result is bit for bit reproducible
    for p0 in range(0, P, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        tile = tl.load(PART + offs_p[:, None] * (R * H) + r * H + offs_h[None, :],
                       mask=(offs_p < P)[:, None] & h_ok[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    y = _round(acc, OUT.dtype.element_ty)  # the down GEMM's bf16 output
    if HAS_RES:  # then the residual add in fp32, rounded again (the engine's add_rmsnorm)
        y = _round(tl.load(RES + r * s_res + offs_h, mask=h_ok, other=0.0).to(tl.float32) + y, OUT.dtype.element_ty)
    tl.store(OUT + r * s_out + offs_h, y.to(OUT.dtype.element_ty), mask=h_ok)


def _check_shapes(x, w_gate_up, w_down, tile: Tile):
    R, H = x.shape
    I = w_down.shape[1]
    if tuple(w_gate_up.shape) != (2 * I, H) or tuple(w_down.shape) != (H, I):
        raise ValueError(f"fused_mlp: x {tuple(x.shape)} needs w_gate_up [2I, H] and w_down [H, I], got "
                         f"{tuple(w_gate_up.shape)} and {tuple(w_down.shape)}")
    if x.stride(1) != 1 or w_gate_up.stride(1) != 1 or w_down.stride(1) != 1:
        raise ValueError("fused_mlp: x and the weights must be contiguous along their last dim")
    if R > MAX_ROWS:
        raise ValueError(f"fused_mlp serves at most {MAX_ROWS} rows, got {R}")
    for name in ("block_i", "block_k", "block_h"):
        b = getattr(tile, name)
        if b < 16 or b & (b - 1):
            raise ValueError(f"fused_mlp: {name}={b} must be a power of two >= 16 (tl.dot)")
    return R, H, I


def mlp_partials(x, w_gate_up, w_down, tile: Tile = Tile(), h_out: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 partials [P, R, H] of the down projection, slab p from intermediate columns
    [p * block_i, (p + 1) * block_i); h_out ([R, I], x's dtype), if given, receives h = silu(gate) * up."""
    R, H, I = _check_shapes(x, w_gate_up, w_down, tile)
    P = triton.cdiv(I, tile.block_i)
    part = torch.empty(P, R, H, dtype=torch.float32, device=x.device)
    if h_out is not None and (tuple(h_out.shape) != (R, I) or not h_out.is_contiguous()):
        raise ValueError(f"mlp_partials: h_out must be a contiguous [{R}, {I}], got {tuple(h_out.shape)}")
    if R:
        fused_mlp_partials[(P,)](
            x, w_gate_up, w_down, part, h_out if h_out is not None else part, R,
            x.stride(0), w_gate_up.stride(0), w_down.stride(0), H=H, I=I,
            BLOCK_M=max(16, triton.next_power_of_2(R)), BLOCK_I=tile.block_i, BLOCK_K=tile.block_k,
            BLOCK_H=tile.block_h, STORE_H=h_out is not None, UPCAST=not x.is_cuda,
            num_warps=tile.num_warps, num_stages=tile.num_stages)
    return part


def reduce_block_h(R: int, H: int) -> int:
    """Column block of the reduce: narrowed from 256 until about REDUCE_PROGRAMS programs run (a 1-row reduce over
    H=1536 would otherwise be 6 programs each reading P slabs in turn), never below 32."""
    b = 256
    while b > 32 and R * triton.cdiv(H, b) < REDUCE_PROGRAMS:
        b //= 2
    return b


def sum_partials(part: torch.Tensor, residual: torch.Tensor | None = None, dtype=torch.bfloat16) -> torch.Tensor:
    """[P, R, H] fp32 partials -> [R, H]: dtype(sum over p), or dtype(residual + dtype(sum)) with a residual."""
    P, R, H = part.shape
    out = torch.empty(R, H, dtype=dtype, device=part.device)
    if residual is not None and (tuple(residual.shape) != (R, H) or residual.stride(1) != 1):
        raise ValueError(f"sum_partials: residual must be [{R}, {H}], contiguous along H")
    if R:
        bh = reduce_block_h(R, H)
        bp = min(triton.next_power_of_2(P), max(1, REDUCE_TILE // bh))
        res = residual if residual is not None else out
        reduce_partials[(R, triton.cdiv(H, bh))](part, res, out, R, P, res.stride(0), out.stride(0), H=H,
                                                 BLOCK_P=bp, BLOCK_H=bh, HAS_RES=residual is not None, num_warps=4)
    return out


def fused_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, residual: torch.Tensor | None = None,
              tile: Tile = Tile()) -> torch.Tensor:
    """down(silu(gate) * up) (+ residual) for x [R, H] (the post-RMSNorm MLP input), w_gate_up [2I, H] (gate rows
    first) and w_down [H, I], both nn.Linear layout: two kernels, the output in x's dtype."""
    return sum_partials(mlp_partials(x, w_gate_up, w_down, tile), residual, x.dtype)


def reference_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """The current path's numerics in torch: gate|up in x's dtype (fp32 accumulation), silu(gate) rounded, times up
    rounded (the engine's silu_mul, and HF's act_fn(gate) * up), the down projection in x's dtype, then the
    residual added in fp32 and rounded."""
    dt = x.dtype
    g, u = F.linear(x, w_gate_up).float().chunk(2, dim=-1)
    h = (F.silu(g).to(dt).float() * u).to(dt)
    y = F.linear(h, w_down)
    return y if residual is None else (residual.float() + y.float()).to(dt)
