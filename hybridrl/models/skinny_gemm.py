"""Skinny (M <= 64 rows) decode GEMMs with their elementwise prologue fused in: RMSNorm before qkv / gate_up,
SiLU-and-mul before down. NOT wired into the decoder: benchmarks/decode_fused_gemm.py decides, on a GPU, whether
and at which row counts they beat the current path; they get used only where that run measures them faster.

What they replace, per decoder layer (decoder.py `_forward_fused`):
- `norm_matmul`: fused.add_rmsnorm + qkv_proj's F.linear (with qkv bias), and fused.add_rmsnorm + gate_up_proj's
  F.linear: two kernels -> one, twice per layer.
- `silu_mul_matmul`: fused.silu_mul + down_proj's F.linear and the cublasLt splitK reduce cuBLAS adds to it: two or
  three kernels -> one.

Why: at the tail of a long-tailed GRPO rollout only 1-16 sequences still decode, and a decode step of the
Qwen2.5-1.5B shape costs ~2.2x its HBM-bandwidth floor (graph step 2.14 ms vs a 1.03 ms byte floor at 8 rows x 3.7k
context; benchmarks/results/long_tail/profile_decode_b8.json). Per step: cuBLAS GEMMs 1.21 ms (qkv 0.15 ms and o_proj
0.136 ms for only ~1.1-1.5 us worth of weight bytes each per layer; gate_up 0.495; down 0.27 + 0.043 splitK reduce),
attention 0.43 + merge 0.047, add_rmsnorm 0.105, silu_mul 0.094, rope_store 0.081: 28 layers of ~10 kernels, each
paying ~2 us of launch / ramp-up. A tile-swept Triton split-K GEMM was within a few percent of cuBLAS at 1-8 rows
(benchmarks/decode_gemm.py, results/long_tail/decode_gemm.json), so what is left to win is kernels per layer.

How:
- Weights [N, K] row-major (nn.Linear), fp32 accumulation, tl.dot on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] with
  the rows padded to BLOCK_M = 16 / 32 / 64 (masked rows are never read). Grid (N tiles, K splits).
- Rounding as the fused kernels (fused.py) round, with their `_round`: new_residual = round(h + residual),
  x = round(w * round(s * rsqrt(mean(s^2) + eps))); a = round(round(silu(g)) * u). The GEMM input is therefore
  exactly the tensor the current path feeds cuBLAS (the RMSNorm up to its fp32 variance-sum order); only the GEMM's
  own summation order differs, and the output is rounded once (after the bias).
- RMSNorm needs whole-row statistics, so every program first sums s^2 over all of K for its rows (M x K is small, and
  L1/L2-resident), then streams its weight tiles, normalising each x tile on the fly. Program (0, 0) alone writes
  new_residual (a fresh tensor: the others still read `residual`). With residual None, new_residual is h itself.
- Split K, deterministic: each split writes its fp32 partial to a [splits, M, N] workspace, takes a ticket from a
  per-N-tile counter (atomic, acq_rel, after a CTA barrier); the last to arrive sums the partials in split order
  0..S-1 (the same bits whichever program is last), adds the bias, stores y and resets the counter to 0 for the next
  launch. No spinning, no second kernel. The counters are one zeroed int32 buffer per device, allocated on the first
  call (make that call before CUDA-graph capture, e.g. in the warm-up); two launches on the same device must not
  run concurrently (one stream, as the decode step is).
- Tiles come from TILES, keyed by (op, M bucket, N, K), else from `default_tile`'s rule (see there); no runtime
  autotuning (CUDA graphs). `python benchmarks/decode_fused_gemm.py --sweep` measures candidates per shape offline.

Shape legend: M rows, K input features (hidden H for norm_matmul, intermediate I for silu_mul_matmul), N outputs.
"""

from __future__ import annotations

import os

import torch

from hybridrl.models import fused

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines without triton: nothing here can run
    triton = tl = None

MAX_ROWS = 64
SMS = 132               # H100 / H200 SMs: what default_tile and the TILES choices assume
COUNTERS = 1 << 16      # int32 tickets per device: one per N tile of a split launch
_counters: dict = {}

# (op, M bucket, N, K) -> launch. Paper choices (nothing measured yet; the sweep replaces them), for 132 SMs:
# - norm (no split: a split would redo the full-row statistics pass): as many programs as fill the SMs once, no
#   more, since each program re-reads the M x K activations twice. 1.5B qkv 2048 x 1536: BLOCK_N 16 -> 128
#   programs (32 -> 64 would idle half the GPU). 1.5B gate_up 17920 x 1536: 64 -> 280 (2.1 per SM); at 33-64 rows,
#   where the activation re-reads grow 4x, 128 -> 140. 7B qkv 4608 x 3584: 32 -> 144. 7B gate_up 37888 x 3584:
#   64 -> 592; 128 -> 296 at 33-64 rows.
# - silu (split K is cheap: the prologue is elementwise, no re-reads): 1.5B down 1536 x 8960: 24 tiles of 64 x 5
#   splits of 14 k-blocks of 128 -> 120 programs (the earlier sweep's best plain GEMM was 64 x 256 x 4 splits,
#   96 programs, plus its separate reduce kernel). 7B down 3584 x 18944: 56 tiles x 7 splits of 22 k-blocks -> 392
#   programs, 2.97 per SM (2 splits -> 112 leave 15% of the SMs idle).
# BLOCK_K 128 throughout: 4 stages of W [64, 128] (+ x [16, 128], if Triton pipelines it) bf16 are <= 80 KB of
# shared memory, 2+ programs per SM; 3 stages at 33-64 rows.
_T = dict
TILES: dict[tuple[str, int, int, int], dict] = {
    ("norm", 16, 2048, 1536): _T(block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 32, 2048, 1536): _T(block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 64, 2048, 1536): _T(block_n=16, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ("norm", 16, 17920, 1536): _T(block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 32, 17920, 1536): _T(block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 64, 17920, 1536): _T(block_n=128, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ("norm", 16, 4608, 3584): _T(block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 32, 4608, 3584): _T(block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 64, 4608, 3584): _T(block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ("norm", 16, 37888, 3584): _T(block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 32, 37888, 3584): _T(block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4),
    ("norm", 64, 37888, 3584): _T(block_n=128, block_k=128, split_k=1, num_warps=4, num_stages=3),
    ("silu", 16, 1536, 8960): _T(block_n=64, block_k=128, split_k=5, num_warps=4, num_stages=4),
    ("silu", 32, 1536, 8960): _T(block_n=64, block_k=128, split_k=5, num_warps=4, num_stages=4),
    ("silu", 64, 1536, 8960): _T(block_n=64, block_k=128, split_k=5, num_warps=4, num_stages=3),
    ("silu", 16, 3584, 18944): _T(block_n=64, block_k=128, split_k=7, num_warps=4, num_stages=4),
    ("silu", 32, 3584, 18944): _T(block_n=64, block_k=128, split_k=7, num_warps=4, num_stages=4),
    ("silu", 64, 3584, 18944): _T(block_n=64, block_k=128, split_k=7, num_warps=4, num_stages=3),
}


ENV = "HYBRIDRL_SKINNY_GEMM"   # "1": on CUDA; "0": off; "force": also on CPU under TRITON_INTERPRET (tests)
DEFAULT = "0"


def serves(h_TH: torch.Tensor) -> bool:
    """Whether the decoder's fused forward takes these kernels for `h_TH`'s rows: 1..MAX_ROWS rows (decode's graph
    buckets and the tail's few sequences), triton present, and the mode (env HYBRIDRL_SKINNY_GEMM) allowing it."""
    mode = os.environ.get(ENV, DEFAULT)
    if mode == "0" or triton is None or not 1 <= h_TH.shape[0] <= MAX_ROWS:
        return False
    return h_TH.is_cuda or mode == "force"


def m_bucket(M: int) -> int:
    """BLOCK_M for M rows: 16 (tl.dot's minimum), 32 or 64."""
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"skinny_gemm serves 1..{MAX_ROWS} rows, got {M}")
    return 16 if M <= 16 else 32 if M <= 32 else 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def splits_of(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """-> (k-blocks per split, splits actually launched): split_k rounded so that no split is empty."""
    kb = _cdiv(K, block_k)
    per = _cdiv(kb, max(1, min(split_k, kb)))
    return per, _cdiv(kb, per)


def _balance(programs: int, sms: int) -> float:
    return programs / (_cdiv(programs, sms) * sms)


def default_tile(op: str, M: int, N: int, K: int, sms: int = SMS) -> dict:
    """The launch for a shape TILES lacks. BLOCK_K 128 (less for small K). norm: the widest BLOCK_N in 64 / 32 / 16
    that still gives >= one program per SM, no split (each split would redo the row statistics) unless even 16
    leaves over half the SMs idle. silu: BLOCK_N 64 (less for small N), then the split count whose programs fill
    whole waves best (programs / (waves x SMs)), at most 4 per SM, >= 4 k-blocks per split; fewer programs on ties."""
    bm = m_bucket(M)
    bk = min(128, max(16, triton.next_power_of_2(K) if triton else 128))
    kb = _cdiv(K, bk)
    if op == "norm":
        bn = next((b for b in (64, 32) if _cdiv(N, b) >= sms), 16)
        split = 1 if 2 * _cdiv(N, bn) >= sms else min(_cdiv(sms, _cdiv(N, bn)), max(1, kb // 4))
    else:
        bn = 64 if N >= 64 * 8 else 16
        tiles = _cdiv(N, bn)
        best = (_balance(tiles, sms), 1)
        for s in range(2, max(1, kb // 4) + 1):
            per, used = splits_of(K, bk, s)
            if used != s or tiles * s > 4 * sms:
                continue
            if _balance(tiles * s, sms) > best[0] + 1e-9:
                best = (_balance(tiles * s, sms), s)
        split = best[1] if tiles < 2 * sms else 1
    return dict(block_n=bn, block_k=bk, split_k=split, num_warps=4, num_stages=4 if bm < 64 else 3)


def tile_for(op: str, M: int, N: int, K: int) -> dict:
    return TILES.get((op, m_bucket(M), N, K)) or default_tile(op, M, N, K)


if triton is not None:
    _round = fused._round

    @triton.jit(do_not_specialize=["M", "k_per_split"])  # one compile serves every row count of a bucket
    def _skinny_kernel(X, R, NW, W, B, Y, RES_OUT, WS, CNT, M, N, K, s_x, s_r, s_ro, s_w, s_y, eps, k_per_split,
                       MODE: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_K: tl.constexpr,
                       IEEE: tl.constexpr):
        """MODE 1: y = rmsnorm(X [+ R]) * NW @ W.T (+ B), RES_OUT = X + R (program (0, 0) only).
        MODE 2: y = (silu(X[:, :K]) * X[:, K:]) @ W.T. SPLIT: partials to WS [splits, M, N], the last of an N tile's
        splits to arrive (ticket from CNT) sums them in split order and writes Y."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        dt = X.dtype.element_ty
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < M
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        xrow = X + rows[:, None].to(tl.int64) * s_x
        rrow = R + rows[:, None].to(tl.int64) * s_r

        if MODE == 1:  # whole-row statistics first: every program needs all of K
            w_rows = tl.where((pid_n == 0) & (pid_k == 0), M, 0)  # program (0, 0) writes new_residual
            ss = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, K, NORM_K):
                kk = k0 + tl.arange(0, NORM_K)
                m = row_ok[:, None] & (kk < K)[None, :]
                s = tl.load(xrow + kk[None, :], mask=m, other=0.0).to(tl.float32)
                if HAS_RES:
                    r = tl.load(rrow + kk[None, :], mask=m, other=0.0).to(tl.float32)
                    s = _round(s + r, dt)
                    tl.store(RES_OUT + rows[:, None].to(tl.int64) * s_ro + kk[None, :], s.to(dt),
                             mask=(rows < w_rows)[:, None] & (kk < K)[None, :])
                ss += tl.sum(s * s, 1)
            rstd = tl.rsqrt(ss / K + eps)

        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        kb_lo = pid_k * k_per_split
        kb_hi = tl.minimum(kb_lo + k_per_split, tl.cdiv(K, BLOCK_K))
        wrow = W + cols[:, None].to(tl.int64) * s_w
        for kb in range(kb_lo, kb_hi):
            kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = kk < K
            m = row_ok[:, None] & k_ok[None, :]
            if MODE == 1:
                s = tl.load(xrow + kk[None, :], mask=m, other=0.0).to(tl.float32)
                if HAS_RES:
                    s = _round(s + tl.load(rrow + kk[None, :], mask=m, other=0.0).to(tl.float32), dt)
                nw = tl.load(NW + kk, mask=k_ok, other=0.0).to(tl.float32)
                a = _round(nw[None, :] * _round(s * rstd[:, None], dt), dt)
            else:
                g = tl.load(xrow + kk[None, :], mask=m, other=0.0).to(tl.float32)
                u = tl.load(xrow + K + kk[None, :], mask=m, other=0.0).to(tl.float32)
                a = _round(_round(g / (1.0 + tl.exp(-g)), dt) * u, dt)
            w = tl.load(wrow + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            if IEEE:
                acc += tl.dot(a.to(w.dtype), tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(a.to(w.dtype), tl.trans(w))

        ymask = row_ok[:, None] & col_ok[None, :]
        yoff = rows[:, None].to(tl.int64) * s_y + cols[None, :]
        if SPLIT:
            MN = M * N
            woff = rows[:, None].to(tl.int64) * N + cols[None, :]
            tl.store(WS + pid_k * MN + woff, acc, mask=ymask)
            tl.debug_barrier()  # every thread's partial is written before the ticket (release) is taken
            ticket = tl.atomic_add(CNT + pid_n, 1, sem="acq_rel", scope="gpu")
            splits = tl.num_programs(1)
            if ticket == splits - 1:
                tot = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for sp in range(0, splits):  # split order, whichever program came last: deterministic
                    tot += tl.load(WS + sp * MN + woff, mask=ymask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    tot += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(Y + yoff, _round(tot, dt).to(Y.dtype.element_ty), mask=ymask)
                tl.atomic_xchg(CNT + pid_n, 0)  # ready for the next launch
        else:
            if HAS_BIAS:
                acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(Y + yoff, _round(acc, dt).to(Y.dtype.element_ty), mask=ymask)


def _counter_buffer(device: torch.device, tiles: int) -> torch.Tensor:
    if tiles > COUNTERS:
        raise ValueError(f"skinny_gemm: {tiles} N tiles in a split launch; at most {COUNTERS}")
    buf = _counters.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("skinny_gemm: the first split-K launch on a device allocates its counters; make it "
                               "before CUDA-graph capture (in the warm-up)")
        buf = _counters[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return buf


def _launch(mode: int, x, r, nw, w, b, y, res_out, K: int, eps: float, tile: dict) -> None:
    M, N = y.shape
    bm = m_bucket(M)
    bn, bk = tile["block_n"], tile["block_k"]
    per, splits = splits_of(K, bk, tile.get("split_k", 1))
    grid = (triton.cdiv(N, bn), splits)
    if splits > 1:
        ws = torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
        cnt = _counter_buffer(x.device, grid[0])
    else:
        ws, cnt = y, y  # not read
    norm_k = min(triton.next_power_of_2(K), max(bk, 8192 // bm))
    _skinny_kernel[grid](
        x, r if r is not None else x, nw if nw is not None else x, w, b if b is not None else w, y,
        res_out if res_out is not None else x, ws, cnt, M, N, K, x.stride(0),
        r.stride(0) if r is not None else 0, res_out.stride(0) if res_out is not None else 0, w.stride(0),
        y.stride(0), eps, per, MODE=mode, HAS_RES=r is not None, HAS_BIAS=b is not None, SPLIT=splits > 1,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NORM_K=norm_k, IEEE=x.dtype == torch.float32,
        num_warps=tile.get("num_warps", 4), num_stages=tile.get("num_stages", 3))


def _check(name: str, x: torch.Tensor, w: torch.Tensor, k: int) -> None:
    if triton is None:
        raise RuntimeError(f"{name} needs triton")
    if x.dim() != 2 or w.dim() != 2 or w.shape[1] != k:
        raise ValueError(f"{name}: input {tuple(x.shape)} does not match weight {tuple(w.shape)} (weight is [N, {k}])")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"{name}: input and weight must be contiguous along their last dim")
    if w.dtype != x.dtype:
        raise ValueError(f"{name}: weight dtype {w.dtype} differs from the input's {x.dtype}")


def norm_matmul(h_MK: torch.Tensor, residual_MK: torch.Tensor | None, norm_weight_K: torch.Tensor, eps: float,
                weight_NK: torch.Tensor, bias_N: torch.Tensor | None = None, tile: dict | None = None):
    """-> (y [M, N], new_residual [M, K]): new_residual = h + residual (h itself when residual is None),
    y = (rmsnorm(new_residual) * norm_weight) @ weight.T (+ bias), rounded as fused.add_rmsnorm then F.linear round.
    new_residual is a fresh tensor (residual is left as it was). 1 <= M <= 64. tile: a TILES-style launch dict."""
    M, K = h_MK.shape
    _check("norm_matmul", h_MK, weight_NK, K)
    if residual_MK is not None and (residual_MK.shape != h_MK.shape or residual_MK.stride(1) != 1):
        raise ValueError(f"norm_matmul: residual {tuple(residual_MK.shape)} must match h {tuple(h_MK.shape)}")
    N = weight_NK.shape[0]
    y = torch.empty(M, N, dtype=h_MK.dtype, device=h_MK.device)
    res_out = torch.empty_like(h_MK) if residual_MK is not None else None
    if M:
        _launch(1, h_MK, residual_MK, norm_weight_K, weight_NK, bias_N, y, res_out, K, eps,
                tile or tile_for("norm", M, N, K))
    return y, (res_out if res_out is not None else h_MK)


def silu_mul_matmul(gate_up_MI2: torch.Tensor, weight_NI: torch.Tensor, tile: dict | None = None) -> torch.Tensor:
    """(silu(gate) * up) @ weight.T for gate_up = cat(gate, up) along the last dim, rounded as fused.silu_mul then
    F.linear round. 1 <= M <= 64. tile: a TILES-style launch dict."""
    M, I2 = gate_up_MI2.shape
    I = I2 // 2  # noqa: E741
    if I2 % 2:
        raise ValueError(f"silu_mul_matmul: gate_up has an odd width {I2}")
    _check("silu_mul_matmul", gate_up_MI2, weight_NI, I)
    N = weight_NI.shape[0]
    y = torch.empty(M, N, dtype=gate_up_MI2.dtype, device=gate_up_MI2.device)
    if M:
        _launch(2, gate_up_MI2, None, None, weight_NI, None, y, None, I, 0.0, tile or tile_for("silu", M, N, I))
    return y
