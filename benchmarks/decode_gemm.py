"""The decode step's GEMMs at small batch: cuBLAS (torch), cuBLAS with TunableOp, and the Triton skinny GEMM.

A decode step multiplies M token rows (M = running sequences) by each weight matrix once; at small M that is a
read of the weights, so each GEMM's floor is its weight bytes over the HBM bandwidth. Each variant is timed on a
CUDA graph that calls it on enough distinct copies of the weight to exceed the L2 cache (as in a real step, where
the other layers' weights pass through L2 between two uses of one matrix), and reported as µs per call and the
fraction of the measured copy bandwidth. The Triton kernel is checked against torch on the same inputs (bf16
tolerances) before it is timed, and its tile sizes are swept per shape; the best is reported. The kernel streams W
in [BLOCK_N, BLOCK_K] tiles with the rows padded to tl.dot's 16, and splits K where N alone gives too few tiles,
adding the fp32 partial sums in a second, fixed-order pass (no atomics: deterministic). It lives here, not in the
engine: on an H200 it was within a few percent of cuBLAS (decode_gemm.json in benchmarks/results/long_tail).

  PYTHONPATH=. python benchmarks/decode_gemm.py --models 1.5B,7B --rows 1,8,16,32,64 --out decode_gemm.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from rollout import SHAPES  # noqa: E402

from hybridrl.bench_manifest import device_facts  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # the benchmark needs a GPU and Triton; importing it on a CPU only lists its options
    triton = None


if triton is not None:

    @triton.jit
    def _skinny_gemm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, stride_os,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            SPLIT_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        k_chunk = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
        k_lo = pid_k * k_chunk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_lo, k_lo + k_chunk, BLOCK_K):
            offs_k = k + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                        mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                        mask=(offs_n[:, None] < N) & k_ok[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w))
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _sum_splits_kernel(part_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < MN
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(SPLIT_K):  # a fixed order: deterministic sums
            acc += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


def block_m_for(m: int) -> int:
    return max(16, triton.next_power_of_2(m)) if triton is not None else 16


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, *, block_n: int, block_k: int, split_k: int,
                num_warps: int = 4, num_stages: int = 4, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K].T -> [M, N] in x's dtype, M ≤ 64, both contiguous along K."""
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"skinny_gemm: x is [{M}, {K}] but w is {tuple(w.shape)}; w must be [N, {K}]")
    if M > 64:
        raise ValueError(f"skinny_gemm serves at most 64 rows, got {M}")
    y = out if out is not None else torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(N, block_n), split_k)
    meta = {"BLOCK_M": block_m_for(M), "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split_k,
            "num_warps": num_warps, "num_stages": num_stages}
    if split_k == 1:
        _skinny_gemm_kernel[grid](x, w, y, M, N, K, x.stride(0), w.stride(0), y.stride(0), 0, **meta)
        return y
    part = torch.empty(split_k, M, N, dtype=torch.float32, device=x.device)
    _skinny_gemm_kernel[grid](x, w, part, M, N, K, x.stride(0), w.stride(0), N, M * N, **meta)
    block = 1024
    _sum_splits_kernel[(triton.cdiv(M * N, block),)](part, y, M * N, SPLIT_K=split_k, BLOCK=block)
    return y


VOCAB = 151936
L2_BYTES = 60 << 20
TILES = [dict(block_n=bn, block_k=bk, split_k=sk, num_warps=nw, num_stages=ns)
         for bn, bk, sk, nw, ns in itertools.product((32, 64, 128), (128, 256), (1, 2, 4, 8), (4,), (4,))]


def gemm_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each weight a decode step reads once: fused qkv, o, fused gate|up, down, the LM head."""
    h, i, _layers, heads, kv, _tied = SHAPES[model]
    d = h // heads
    return {"qkv": ((heads + 2 * kv) * d, h), "o": (h, h), "gate_up": (2 * i, h), "down": (h, i),
            "lm_head": (VOCAB, h)}


def graph_replay_us(fn, reps: int = 10) -> tuple[float, object]:
    """Median µs of one replay of a CUDA graph of fn() (warmed up once on a side stream), and fn's output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return sorted(times)[len(times) // 2], out


def graph_time_us(fn, copies: list[torch.Tensor], calls: int = 40, reps: int = 10) -> float:
    """µs per call of fn(w) over a CUDA graph of `calls` calls cycling through `copies`."""
    us, _ = graph_replay_us(lambda: [fn(copies[c % len(copies)]) for c in range(calls)], reps)
    return us / calls


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|, in fp32 (a zero reference counts as 1e-30)."""
    got, ref = got.float(), ref.float()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def tile_error(e: Exception) -> str:
    """A failed tile's record: the exception's type and the start of its message."""
    return f"{type(e).__name__}: {str(e)[:300]}"


def write_rows(out_path: Path, result: dict, m: int, rec: dict, t0: float) -> None:
    """A tile sweep's progress: `rec` stored under result["rows"][m], the JSON rewritten (a cut-off run keeps what it
    measured) and the row's per-layer times printed."""
    result["rows"][str(m)] = rec
    result["wall_s"] = time.time() - t0
    out_path.write_text(json.dumps(result, indent=1))
    print(json.dumps({"rows": m} | {k: (round(v, 2) if isinstance(v, float) else v) for k, v in rec.items()
                                    if k.endswith(("us_per_layer", "best_tile"))}), flush=True)


def report_failed_tiles(out_path: Path, result: dict) -> None:
    failed = sum("error" in e for r in result["rows"].values() for e in r["tiles"])
    print(f"wrote {out_path} ({failed} tile runs failed: see their 'error')", flush=True)


def copy_bandwidth() -> float:
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        y.copy_(x)
    e.record()
    e.synchronize()
    return 2 * (2 << 30) * 10 / (s.elapsed_time(e) / 1e3)


def skinny_x(x, w, tile):
    return skinny_gemm(x, w, **tile)


def check(x, w, tile) -> float:
    """max |triton - torch| / max |torch|; raises when over bf16 tolerance."""
    ref = F.linear(x.float(), w.float())
    got = skinny_gemm(x, w, **tile).float()
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    if err > 2e-2:
        raise AssertionError(f"skinny_gemm {tuple(x.shape)} x {tuple(w.shape)} {tile}: relative error {err:.3g}")
    return err


def bench_shape(name, n, k, rows, bw, tunable: bool) -> list[dict]:
    dtype = torch.bfloat16
    nbytes = n * k * 2
    copies = [torch.randn(n, k, device="cuda", dtype=dtype) * 0.02 for _ in range(max(2, -(-L2_BYTES // nbytes) + 1))]
    out = []
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        floor_us = nbytes / bw * 1e6
        rec = {"gemm": name, "N": n, "K": k, "M": m, "weight_mb": nbytes / 1e6, "floor_us": floor_us}
        linear = partial(F.linear, x)
        rec["cublas_us"] = graph_time_us(linear, copies)
        if tunable:
            torch.cuda.tunable.enable(True)
            torch.cuda.tunable.tuning_enable(True)
            F.linear(x, copies[0])  # tunes this shape once
            torch.cuda.tunable.tuning_enable(False)
            rec["tunableop_us"] = graph_time_us(linear, copies)
            torch.cuda.tunable.enable(False)
        best = None
        if m <= 64:
            for tile in TILES:
                if tile["split_k"] > 1 and k // tile["split_k"] < tile["block_k"]:
                    continue
                try:
                    err = check(x, copies[0], tile)
                    t = graph_time_us(partial(skinny_x, x, tile=tile), copies, calls=20, reps=5)
                except AssertionError:
                    raise
                except Exception as e:  # a tile the compiler refuses (shared memory): skipped, said
                    rec.setdefault("tiles_refused", []).append(f"{tile}: {type(e).__name__}")
                    continue
                if best is None or t < best[0]:
                    best = (t, tile, err)
            rec["triton_us"], rec["triton_tile"], rec["triton_rel_err"] = best
            rec["triton_us_recheck"] = graph_time_us(partial(skinny_x, x, tile=best[1]), copies)
        for key in ("cublas_us", "tunableop_us", "triton_us_recheck"):
            if key in rec:
                rec[key.replace("_us", "").replace("_recheck", "") + "_x_floor"] = rec[key] / floor_us
        print(json.dumps({k: v for k, v in rec.items() if k != "tiles_refused"}), flush=True)
        out.append(rec)
    del copies
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="1.5B,7B")
    p.add_argument("--rows", default="1,8,16,32,64,128,256")
    p.add_argument("--no-tunableop", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    t0 = time.time()
    bw = copy_bandwidth()
    result = {"benchmark": "decode_gemm", "command": " ".join(sys.argv), "device": device_facts(),
              "copy_gb_per_s": bw / 1e9, "rows": rows, "models": {}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for model in args.models.split(","):  # written after every shape: a run cut short keeps what it measured
        result["models"][model] = []
        for name, (n, k) in gemm_shapes(model).items():
            result["models"][model] += bench_shape(name, n, k, rows, bw, not args.no_tunableop)
            result["wall_s"] = time.time() - t0
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
