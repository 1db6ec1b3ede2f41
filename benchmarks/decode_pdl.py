"""A decode layer's GEMM chain at small batch: cuBLAS against Triton skinny GEMMs with and without programmatic
dependent launch (PDL), and with each program's weight slab prefetched toward L2 before it waits.

The chain is what a decode step runs per layer, 28 layers deep, each on its own weights (so L2 holds no layer's
weights from one replay to the next): qkv (with bias) -> o (on the first q columns) -> gate|up -> down (on the
first half) -> the next layer. Every variant runs in one CUDA graph; reported as µs per layer against the weight
bytes over the measured copy bandwidth. Tiles are swept per (GEMM, rows) on a chain of that GEMM alone launched
with PDL; each tile is checked against torch in fp32 first (bf16 tolerance), and the PDL chain's output must equal
the plain Triton chain's bit for bit (the same kernels, so any difference would be a race).

The kernel: y[M, N] = x[M, K] @ w[N, K].T (+ bias), M <= 64 rows padded to tl.dot's 16, K split over programs where
N alone gives too few (fp32 partials summed by a second kernel in a fixed order: deterministic). With PDL each
program loads its first weight tile (no kernel before it writes weights), optionally asks L2 for the rest of its
slab, and only then waits (`gdc_wait`) for the previous kernel's output; right after, it lets the next kernel start
(`gdc_launch_dependents`). It lives here, not in the engine: on an H200 PDL took 4-9% off the 1.5B chain at 1-8
rows and lost to cuBLAS at 64, the prefetch made it slower (long_tail/decode_pdl_*.json).

  PYTHONPATH=. python benchmarks/decode_pdl.py --model 1.5B --rows 1,8,64 --out decode_pdl.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # the benchmark needs a GPU and Triton; on a CPU it only lists its options
    triton = None

sys.path.insert(0, str(Path(__file__).parent))
from decode_gemm import copy_bandwidth, gemm_shapes, graph_replay_us  # noqa: E402
from rollout import SHAPES  # noqa: E402

from hybridrl.bench_manifest import device_facts  # noqa: E402

LINE_ELEMS = 64  # bf16 elements in a 128-byte cache line
_jit = triton.jit if triton is not None else (lambda f: f)


@dataclass(frozen=True)
class Tile:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


@_jit
def _skinny_gemm_kernel(X, W, BIAS, Y, M, N, s_xm, s_wn, s_ym, s_ys,
                        K: tl.constexpr, K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, GDC: tl.constexpr,
                        PREFETCH_LINES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_lo = pid_k * K_CHUNK
    if PREFETCH_LINES > 0:  # this program's weight slab toward L2 while the kernel before still runs
        line = tl.arange(0, PREFETCH_LINES)
        koff = tl.minimum(k_lo + line * 64, K - 1)
        nn = tl.minimum(offs_n, N - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [W + nn[:, None] * s_wn + koff[None, :]],
                                  dtype=tl.int32, is_pure=False, pack=1)
    offs_k = k_lo + tl.arange(0, BLOCK_K)
    w = tl.load(W + offs_n[:, None] * s_wn + offs_k[None, :], mask=n_ok[:, None] & (offs_k[None, :] < K), other=0.0)
    if GDC:  # the weights above need no ordering; x (and the output) do
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(X + offs_m[:, None] * s_xm + offs_k[None, :], mask=m_ok[:, None] & (offs_k[None, :] < K), other=0.0)
    acc = tl.dot(x, tl.trans(w), out_dtype=tl.float32)
    for k in range(k_lo + BLOCK_K, k_lo + K_CHUNK, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = tl.load(W + offs_n[:, None] * s_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(X + offs_m[:, None] * s_xm + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + pid_k * s_ys + offs_m[:, None] * s_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@_jit
def _sum_splits_kernel(P, Y, M, N, s_ym, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):  # a fixed order: deterministic sums
        acc += tl.load(P + s * M * N + offs, mask=ok, other=0.0)
    tl.store(Y + (offs // N) * s_ym + offs % N, acc.to(Y.dtype.element_ty), mask=ok)


def skinny_gemm(x_MK: torch.Tensor, w_NK: torch.Tensor, bias_N: torch.Tensor | None, tile: Tile, *,
                pdl: bool = False, prefetch: bool = False) -> torch.Tensor:
    """x [M, K] (rows may be strided, K contiguous) @ w [N, K].T (+ bias) -> [M, N] in x's dtype, M <= 64.
    pdl: launch with programmatic dependent launch (Hopper+), waiting on the previous kernel before reading x;
    prefetch: first ask L2 for the program's whole weight slab."""
    M, K = x_MK.shape
    N = w_NK.shape[0]
    if w_NK.shape[1] != K or x_MK.stride(1) != 1 or w_NK.stride(1) != 1:
        raise ValueError(f"skinny_gemm: x {tuple(x_MK.shape)} and w {tuple(w_NK.shape)} must share K, contiguous")
    if M > 64:
        raise ValueError(f"skinny_gemm serves at most 64 rows, got {M}")
    k_chunk = triton.cdiv(K, tile.split_k * tile.block_k) * tile.block_k
    split_k = triton.cdiv(K, k_chunk)
    y = torch.empty(M, N, dtype=x_MK.dtype, device=x_MK.device)
    dst = y if split_k == 1 else torch.empty(split_k, M, N, dtype=torch.float32, device=x_MK.device)
    s_ym, s_ys = (y.stride(0), 0) if split_k == 1 else (N, M * N)
    lines = triton.next_power_of_2(triton.cdiv(k_chunk, LINE_ELEMS)) if prefetch else 0
    _skinny_gemm_kernel[(triton.cdiv(N, tile.block_n), split_k)](
        x_MK, w_NK, bias_N if bias_N is not None else w_NK, dst, M, N, x_MK.stride(0), w_NK.stride(0), s_ym, s_ys,
        K=K, K_CHUNK=k_chunk, BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, HAS_BIAS=bias_N is not None, GDC=pdl, PREFETCH_LINES=lines,
        num_warps=tile.num_warps, num_stages=tile.num_stages, launch_pdl=pdl)
    if split_k > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(M * N, block),)](dst, y, M, N, y.stride(0), SPLIT_K=split_k, BLOCK=block,
                                                          GDC=pdl, num_warps=4, launch_pdl=pdl)
    return y


TILES = [dict(block_n=bn, block_k=bk, split_k=sk)
         for bn, bk, sk in itertools.product((16, 32, 64), (128, 256), (1, 2, 4, 8))]


def layer_weights(model: str, layers: int, dtype=torch.bfloat16) -> tuple[list[dict], dict]:
    """`layers` layers' random qkv (with bias), o, gate|up and down weights, and their (N, K) shapes."""
    shapes = {name: nk for name, nk in gemm_shapes(model).items() if name != "lm_head"}
    ws = [{name: torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5 for name, (n, k) in shapes.items()}
          | {"qkv_bias": torch.randn(shapes["qkv"][0], device="cuda", dtype=dtype) * 0.02} for _ in range(layers)]
    return ws, shapes


def chain(gemm, x, ws, h: int, inter: int):
    """The layer chain over all layers; gemm(name, x, w, bias) -> y."""
    for w in ws:
        qkv = gemm("qkv", x, w["qkv"], w["qkv_bias"])
        o = gemm("o", qkv[:, :h], w["o"], None)
        gu = gemm("gate_up", o, w["gate_up"], None)
        x = gemm("down", gu[:, :inter], w["down"], None)
    return x


def one_gemm_chain(gemm, x, ws, name, bias):
    """gemm(x, w, bias) on every layer's copy of one weight (the same input)."""
    return [gemm(x, w[name], w[bias] if bias else None) for w in ws]


def by_name(gemm, tiles, name, x, w, b):
    """chain()'s gemm from a plain one: tiles (or None: cuBLAS) chosen per GEMM name."""
    return gemm(x, w, b) if tiles is None else gemm(x, w, b, tiles[name])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="1.5B")
    p.add_argument("--rows", default="1,8,64")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    t0 = time.time()
    bw = copy_bandwidth()
    h, inter = SHAPES[args.model][0], SHAPES[args.model][1]
    ws, shapes = layer_weights(args.model, args.layers)
    layer_bytes = sum(n * k * 2 for n, k in shapes.values())
    result = {"benchmark": "decode_pdl", "command": " ".join(sys.argv), "device": device_facts(),
              "copy_gb_per_s": bw / 1e9, "model": args.model, "layers": args.layers,
              "layer_weight_mb": layer_bytes / 1e6, "floor_us_per_layer": layer_bytes / bw * 1e6, "rows": {}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for m in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
        rec = {"tiles": {}, "per_gemm_us": {}}
        for name, (n, k) in shapes.items():  # sweep: a chain of this GEMM alone, one per layer's weight
            xin = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            bias = "qkv_bias" if name == "qkv" else None
            ref = F.linear(xin.float(), ws[0][name].float(), ws[0][bias].float() if bias else None)
            best = None
            for t in TILES:
                tile = Tile(**t)
                if tile.split_k > 1 and k // tile.split_k < tile.block_k:
                    continue
                try:
                    got = skinny_gemm(xin, ws[0][name], ws[0][bias] if bias else None, tile, pdl=True).float()
                except Exception as e:  # a tile the compiler refuses (shared memory): skipped, said
                    rec.setdefault("tiles_refused", []).append(f"{name} {t}: {type(e).__name__}")
                    continue
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                if err > 2e-2:
                    raise AssertionError(f"skinny_gemm {name} M={m} {t}: relative error {err:.3g}")
                us, _ = graph_replay_us(partial(one_gemm_chain, partial(skinny_gemm, tile=tile, pdl=True), xin, ws, name,
                                         bias), reps=5)
                if best is None or us < best[0]:
                    best = (us, tile, err)
            cub, _ = graph_replay_us(partial(one_gemm_chain, F.linear, xin, ws, name, bias), reps=10)
            rec["tiles"][name] = best[1]
            rec["per_gemm_us"][name] = {"cublas": cub / args.layers, "triton_pdl": best[0] / args.layers,
                                        "rel_err": best[2], "floor": n * k * 2 / bw * 1e6}
        tiles = rec["tiles"]

        variants = {"cublas": partial(by_name, F.linear, None),
                    "triton": partial(by_name, skinny_gemm, tiles),
                    "triton_pdl": partial(by_name, partial(skinny_gemm, pdl=True), tiles),
                    "triton_pdl_prefetch": partial(by_name, partial(skinny_gemm, pdl=True, prefetch=True), tiles)}
        outs = {}
        for name, g in variants.items():
            us, out = graph_replay_us(partial(chain, g, x, ws, h, inter), reps=20)
            rec[name + "_us_per_layer"] = us / args.layers
            outs[name] = out.float()
        for name in ("triton_pdl", "triton_pdl_prefetch"):
            rec[name + "_equals_triton"] = bool(torch.equal(outs[name], outs["triton"]))
        rec["triton_vs_cublas_rel_err"] = ((outs["triton"] - outs["cublas"]).abs().max()
                                           / outs["cublas"].abs().max()).item()
        rec["tiles"] = {k: vars(v) for k, v in tiles.items()}
        result["rows"][str(m)] = rec
        result["wall_s"] = time.time() - t0
        print(json.dumps({"M": m} | {k: v for k, v in rec.items() if k.endswith(("layer", "triton", "err"))}),
              flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
