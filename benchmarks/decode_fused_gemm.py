"""The decode step's norm / activation + GEMM pairs at 1-64 rows: the current path against the fused skinny GEMMs
(hybridrl/models/skinny_gemm.py), one GPU, bf16.

Per decoder layer the current path runs fused.add_rmsnorm + cuBLAS F.linear for qkv (with its bias), the same for
gate_up, and fused.silu_mul + F.linear for down (cuBLAS may add a splitK reduce); the fused path runs norm_matmul,
norm_matmul and silu_mul_matmul. Each variant is timed as decode_kernels.py times kernels: a CUDA graph of one call
per layer, layer i on its own weights and activations (28 layers: the weights stream from HBM as in a step), µs per
call = replay time / layers, median of the replays. Also timed: cuBLAS alone (the GEMM without its norm / activation)
and a whole layer's three pairs in sequence. Before timing, the fused results are checked against the current path
on the same inputs (bf16: within 2e-2 of the largest |y|; new_residual bit for bit). ratio = fused / current (< 1:
the fused kernel is faster). The weights' bytes over the measured copy bandwidth are reported as each GEMM's floor.

  PYTHONPATH=. python benchmarks/decode_fused_gemm.py --out benchmarks/results/long_tail/decode_fused_gemm.json

--sweep: the offline tile sweep instead (no runtime autotuning: CUDA graphs). Per (op, shape, rows), every
(BLOCK_N, BLOCK_K, K splits) at 4 warps x 3 stages, then warps x stages for the best, each checked and timed as
above; writes the best tile per (op, M bucket, N, K) as `best_tiles`, which the main mode takes with --tiles FILE
(and which belong in skinny_gemm.TILES once measured). Compiles dominate (~1-2 s per tile); narrow it with --models,
--ops and --rows, and --budget-s stops it cleanly (what it measured is saved after every shape).

  PYTHONPATH=. python benchmarks/decode_fused_gemm.py --sweep --models 1.5B --rows 8 --out /root/out/sweep_15b_8.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from decode_gemm import copy_bandwidth, gemm_shapes, graph_time_us  # noqa: E402

from hybridrl.bench_manifest import device_facts  # noqa: E402

EPS = 1e-6
OPS = ("qkv", "gate_up", "down")
SWEEP_BN, SWEEP_BK, SWEEP_SPLITS = (16, 32, 64, 128), (64, 128, 256), (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
SWEEP_WARPS_STAGES = [(w, s) for w in (2, 4, 8) for s in (2, 3, 4, 5)]
DEVICE, DTYPE = "cuda", torch.bfloat16   # a CPU dry run of the logic (tests, under TRITON_INTERPRET): "cpu", fp16


def graph_us(fn_of_layer, layers: int, reps: int) -> float:
    """µs per call of fn_of_layer(i) in a CUDA graph of one call per layer (decode_kernels.graph_us)."""
    return graph_time_us(fn_of_layer, list(range(layers)), calls=layers, reps=reps)


class Model:
    """`layers` layers' weights of one model's three pairs (each layer its own), and per-row-count activations."""

    def __init__(self, name: str, layers: int):
        shapes = gemm_shapes(name)
        self.name, self.layers = name, layers
        self.hidden = shapes["o"][0]
        self.qkv = shapes["qkv"][0]
        self.inter = shapes["down"][1]
        dev, dt = DEVICE, DTYPE
        g = torch.Generator(dev).manual_seed(0)

        def rand(*shape, scale=0.02):
            return (scale * torch.randn(*shape, device=dev, generator=g)).to(dt)

        self.ln1 = [(1 + rand(self.hidden, scale=0.1)) for _ in range(layers)]
        self.ln2 = [(1 + rand(self.hidden, scale=0.1)) for _ in range(layers)]
        self.w = {"qkv": [rand(self.qkv, self.hidden) for _ in range(layers)],
                  "gate_up": [rand(2 * self.inter, self.hidden) for _ in range(layers)],
                  "down": [rand(self.hidden, self.inter) for _ in range(layers)]}
        self.bias = [rand(self.qkv, scale=1.0) for _ in range(layers)]

    def nk(self, op: str) -> tuple[int, int]:
        return {"qkv": (self.qkv, self.hidden), "gate_up": (2 * self.inter, self.hidden),
                "down": (self.hidden, self.inter)}[op]

    def activations(self, M: int) -> None:
        dev, dt = DEVICE, DTYPE
        g = torch.Generator(dev).manual_seed(M)
        self.h = [torch.randn(M, self.hidden, device=dev, generator=g).to(dt) for _ in range(self.layers)]
        self.res = [torch.randn(M, self.hidden, device=dev, generator=g).to(dt) for _ in range(self.layers)]
        self.gu = [(2 * torch.randn(M, 2 * self.inter, device=dev, generator=g)).to(dt) for _ in range(self.layers)]

    # the three pairs, current and fused, on layer i
    def current(self, op: str, i: int):
        from hybridrl.models import fused

        if op == "down":
            return F.linear(fused.silu_mul(self.gu[i]), self.w["down"][i])
        ln = self.ln1[i] if op == "qkv" else self.ln2[i]
        x, _ = fused.add_rmsnorm(self.h[i], self.res[i], ln, EPS)   # adds h into res in place, as the decoder does
        return F.linear(x, self.w[op][i], self.bias[i] if op == "qkv" else None)

    def fused(self, op: str, i: int, tile: dict | None = None):
        from hybridrl.models import skinny_gemm as S

        if op == "down":
            return S.silu_mul_matmul(self.gu[i], self.w["down"][i], tile=tile)
        ln = self.ln1[i] if op == "qkv" else self.ln2[i]
        return S.norm_matmul(self.h[i], self.res[i], ln, EPS, self.w[op][i], self.bias[i] if op == "qkv" else None,
                             tile=tile)[0]

    def cublas_only(self, op: str, i: int):
        x = self.gu[i][:, : self.inter] if op == "down" else self.h[i]
        return F.linear(x, self.w[op][i], self.bias[i] if op == "qkv" else None)

    def check(self, op: str, tile: dict | None = None) -> dict:
        """Fused vs current on layer 0's inputs (the current path's residual add on a copy); raises past bf16."""
        from hybridrl.models import fused
        from hybridrl.models import skinny_gemm as S

        if op == "down":
            ref = F.linear(fused.silu_mul(self.gu[0]), self.w["down"][0])
            got, res_ok = S.silu_mul_matmul(self.gu[0], self.w["down"][0], tile=tile), True
        else:
            ln, b = (self.ln1[0], self.bias[0]) if op == "qkv" else (self.ln2[0], None)
            x, rr = fused.add_rmsnorm(self.h[0], self.res[0].clone(), ln, EPS)
            ref = F.linear(x, self.w[op][0], b)
            got, new_res = S.norm_matmul(self.h[0], self.res[0], ln, EPS, self.w[op][0], b, tile=tile)
            res_ok = bool(torch.equal(new_res, rr))
        rel = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        out = {"rel_err": rel, "bits_differ": (got != ref).float().mean().item(), "new_residual_exact": res_ok}
        if rel > 2e-2 or not res_ok:
            raise AssertionError(f"{self.name} {op} M={got.shape[0]} tile={tile}: {out}")
        return out


def bench_rows(model: Model, M: int, bw: float, reps: int, ops=OPS) -> tuple[list[dict], dict]:
    from hybridrl.models import skinny_gemm as S

    model.activations(M)
    L = model.layers
    recs = []
    for op in ops:
        n, k = model.nk(op)
        rec = {"model": model.name, "op": op, "M": M, "N": n, "K": k,
               "tile": S.tile_for("silu" if op == "down" else "norm", M, n, k), "check": model.check(op),
               "floor_us": n * k * 2 / bw * 1e6}
        rec["current_us"] = graph_us(lambda i, op=op: model.current(op, i), L, reps)
        rec["fused_us"] = graph_us(lambda i, op=op: model.fused(op, i), L, reps)
        rec["cublas_only_us"] = graph_us(lambda i, op=op: model.cublas_only(op, i), L, reps)
        rec["ratio"] = rec["fused_us"] / rec["current_us"]
        for key in ("current", "fused", "cublas_only"):
            rec[f"{key}_x_floor"] = rec[f"{key}_us"] / rec["floor_us"]
        print(json.dumps(rec), flush=True)
        recs.append(rec)

    def layer(path):
        def run(i):
            for op in ops:
                path(op, i)
        return run

    lay = {"model": model.name, "M": M, "current_us": graph_us(layer(model.current), L, reps),
           "fused_us": graph_us(layer(model.fused), L, reps),
           "floor_us": sum(r["floor_us"] for r in recs)}
    lay["ratio"] = lay["fused_us"] / lay["current_us"]
    lay["saved_us_per_step"] = (lay["current_us"] - lay["fused_us"]) * L
    print("[layer]", json.dumps(lay), flush=True)
    return recs, lay


def sweep_candidates(op: str, M: int, n: int, k: int) -> list[dict]:
    from hybridrl.models import skinny_gemm as S

    out, seen = [], set()
    for bn, bk in itertools.product(SWEEP_BN, SWEEP_BK):
        if bk > max(16, k):
            continue
        for split in SWEEP_SPLITS if op == "down" else (1, 2):
            _, used = S.splits_of(k, bk, split)
            programs = S._cdiv(n, bn) * used
            if (bn, bk, used) in seen or (used > 1 and programs > 5 * S.SMS):
                continue
            seen.add((bn, bk, used))
            out.append(dict(block_n=bn, block_k=bk, split_k=used, num_warps=4, num_stages=3))
    return out


def sweep_shape(model: Model, op: str, M: int, reps: int, result: dict, deadline: float) -> None:
    from hybridrl.models import skinny_gemm as S

    n, k = model.nk(op)
    kind = "silu" if op == "down" else "norm"
    key = f"{kind},{S.m_bucket(M)},{n},{k}"
    rec = {"model": model.name, "op": op, "M": M, "N": n, "K": k, "key": key, "default": S.tile_for(kind, M, n, k),
           "current_us": graph_us(lambda i: model.current(op, i), model.layers, reps), "tiles": []}

    def measure(tile):
        try:
            err = model.check(op, tile)["rel_err"]
            us = graph_us(lambda i: model.fused(op, i, tile), model.layers, reps)
        except AssertionError:
            raise
        except Exception as e:  # a tile the compiler refuses (shared memory, registers): recorded, skipped
            rec["tiles"].append({**tile, "refused": f"{type(e).__name__}: {str(e)[:160]}"})
            return
        rec["tiles"].append({**tile, "us": us, "rel_err": err})

    for tile in [rec["default"]] + sweep_candidates(op, M, n, k):
        if time.time() > deadline:
            rec["cut_short"] = True
            break
        measure(tile)
    timed = [t for t in rec["tiles"] if "us" in t]
    best = min(timed, key=lambda t: t["us"])
    for w, s in SWEEP_WARPS_STAGES:
        if time.time() > deadline:
            rec["cut_short"] = True
            break
        if (w, s) != (best["num_warps"], best["num_stages"]):
            measure({**{k2: best[k2] for k2 in ("block_n", "block_k", "split_k")}, "num_warps": w, "num_stages": s})
    timed = [t for t in rec["tiles"] if "us" in t]
    best = min(timed, key=lambda t: t["us"])
    rec["best"] = best
    rec["default_us"] = timed[0]["us"] if rec["tiles"][0].get("us") else None
    rec["best_ratio"] = best["us"] / rec["current_us"]
    result["shapes"].append(rec)
    prev = result["best_tiles"].get(key)
    if prev is None or best["us"] < prev["us"]:
        result["best_tiles"][key] = {**{k2: best[k2] for k2 in ("block_n", "block_k", "split_k", "num_warps",
                                                                 "num_stages")}, "us": best["us"], "M": M}
    print(f"[sweep] {model.name} {op} M={M}: current {rec['current_us']:.2f} us, default {rec['default_us']} us, "
          f"best {json.dumps(best)} "
          f"({len(timed)} tiles timed)", flush=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1.5B,7B")
    ap.add_argument("--rows", default=None, help="default 1,4,8,16,32,64 (--sweep: 8,32,64, one per M bucket)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiles", default=None, help="a --sweep output: its best_tiles override skinny_gemm.TILES")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop cleanly (results saved) after this long")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import triton

    from hybridrl.models import skinny_gemm as S

    t0 = time.time()
    deadline = t0 + args.budget_s
    rows = [int(r) for r in (args.rows or ("8,32,64" if args.sweep else "1,4,8,16,32,64")).split(",")]
    ops = args.ops.split(",")
    if args.tiles:
        for key, t in json.loads(Path(args.tiles).read_text())["best_tiles"].items():
            op, bucket, n, k = key.split(",")
            S.TILES[(op, int(bucket), int(n), int(k))] = {k2: t[k2] for k2 in ("block_n", "block_k", "split_k",
                                                                                "num_warps", "num_stages")}
    bw = copy_bandwidth()
    result = {"benchmark": "decode_fused_gemm" + ("_sweep" if args.sweep else ""),
              "command": "PYTHONPATH=. python " + shlex.join(sys.argv), "device": device_facts(),
              "torch": torch.__version__, "triton": triton.__version__,
              "sms": torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else None,
              "copy_gb_per_s": bw / 1e9, "layers": args.layers, "reps": args.reps, "rows": rows,
              "tiles": {",".join(map(str, k)): v for k, v in S.TILES.items()}}
    if args.sweep:
        result.update(shapes=[], best_tiles={})
    else:
        result.update(pairs=[], layers_total=[])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    def save():
        result["wall_s"] = time.time() - t0
        Path(args.out).write_text(json.dumps(result, indent=1))

    for name in args.models.split(","):
        model = Model(name, args.layers)
        for M in rows:
            if time.time() > deadline:
                result["cut_short"] = True
                break
            if args.sweep:
                model.activations(M)
                for op in ops:
                    if time.time() < deadline:
                        sweep_shape(model, op, M, args.reps, result, deadline)
                        save()
            else:
                recs, lay = bench_rows(model, M, bw, args.reps, ops)
                result["pairs"] += recs
                result["layers_total"].append(lay)
                save()
        del model
        torch.cuda.empty_cache()
    save()
    return result


if __name__ == "__main__":
    main()
