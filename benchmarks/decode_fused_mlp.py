"""A decoder layer's MLP at small decode batch (1-32 rows): the current path's kernels against one fused Triton
kernel plus a small reduce.

The current path runs, per layer, a cuBLAS gate|up GEMM, the engine's Triton silu_mul
(hybridrl.models.fused.silu_mul), a cuBLAS down GEMM (split-K with its own reduce kernel at these shapes) and the
residual add. At a few rows every one of them is a read of weights, so a layer's floor is its weight bytes over the
HBM bandwidth (82.5 MB for Qwen2.5-1.5B: ~22 µs at 3.8 TB/s, against ~32 µs measured on an H200 at 8 rows).

The fused path (hybridrl/models/fused_mlp.py, the engine's MLP at up to 16 rows): one kernel per layer gives each
program a slice of the intermediate columns (gate|up GEMV, SiLU-and-mul with the current path's roundings, that
slice's share of the down projection as fp32 partials), then a deterministic reduce adds the residual.

Every variant runs the `layers`-deep chain (layer i's output is layer i+1's input, each layer its own weights, so L2
holds no layer's weights from one replay to the next) in one CUDA graph; reported as µs per layer against the byte
floor (weight bytes over the measured copy bandwidth). Each tile is first checked against `reference_mlp` on one
layer (bf16 tolerance, TOL); a tile that fails the check, or that the compiler refuses, is recorded with its error
and not timed. `current` and the swept fused tiles include the residual add (a torch add in the current path, free in
the fused reduce); in the engine that add rides in the next add_rmsnorm, so `current_no_residual` against
`fused_no_residual` (best tile) is the comparison that carries over. On one H100 the fused MLP took 0.87-0.96x the
current path's time at 1-16 rows and 1.11x at 32 (benchmarks/results/long_tail/decode_fused_mlp_1.5b*.json).

  PYTHONPATH=. python benchmarks/decode_fused_mlp.py --model 1.5B --rows 1,4,8,16,32 --out decode_fused_mlp.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import triton
except ImportError:  # the benchmark needs a GPU and Triton; on a CPU it only lists its options
    triton = None

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
from hybridrl.models.fused_mlp import (  # noqa: E402
    MAX_ROWS,
    Tile,
    fused_mlp,
    reference_mlp,
)

if triton is not None:
    from hybridrl.models.fused import silu_mul  # noqa: E402

TOL = 2e-2         # max |fused - reference| / max |reference|: see check()
WEIGHT_SCALE = 0.5  # weights ~ N(0, WEIGHT_SCALE^2 / fan_in): the 28-layer residual chain stays near unit RMS

# gate and up tiles are 2 x block_i x block_k bf16 per pipeline stage: block_i * block_k <= 16K keeps three stages
# within Hopper's shared memory; block_i trades programs (enough to fill the SMs) against partials bytes
TILES = [dict(block_i=bi, block_k=bk, block_h=bh, num_warps=nw)
         for bi, bk, bh, nw in itertools.product((32, 64, 128), (64, 128, 256), (64, 128), (4, 8))
         if 4096 <= bi * bk <= 16384]


def check(x, w_gate_up, w_down, residual, tile: Tile) -> float:
    """max |fused - reference| / max |reference| over the MLP output alone and with the residual; raises over TOL.
    The two round the same intermediates to bf16 and differ only in fp32 summation order, which can move a rounding
    of gate, up, silu or h by one bf16 ulp (2^-8 relative) and the output's by one ulp: ~1e-2 of the largest output
    at most. A wrong mask, slice or dropped partial gives O(1)."""
    errs = []
    for res in (None, residual):
        ref = reference_mlp(x, w_gate_up, w_down, res).float()
        got = fused_mlp(x, w_gate_up, w_down, res, tile).float()
        errs.append(rel_err(got, ref))
    if not max(errs) <= TOL:  # NaN fails too
        raise AssertionError(f"fused_mlp {tuple(x.shape)} {asdict(tile)}: relative error {errs} over {TOL}")
    return max(errs)


def layer_weights(h: int, inter: int, layers: int, dtype=torch.bfloat16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(2 * inter, h, device="cuda", dtype=dtype) * (WEIGHT_SCALE / h ** 0.5),
             torch.randn(h, inter, device="cuda", dtype=dtype) * (WEIGHT_SCALE / inter ** 0.5))
            for _ in range(layers)]


def current_chain(x, ws, residual: bool):
    """cuBLAS gate|up -> the engine's silu_mul -> cuBLAS down (-> residual add), every layer."""
    for w_gate_up, w_down in ws:
        y = F.linear(silu_mul(F.linear(x, w_gate_up)), w_down)
        x = x + y if residual else y
    return x


def fused_chain(x, ws, tile: Tile, residual: bool):
    for w_gate_up, w_down in ws:
        x = fused_mlp(x, w_gate_up, w_down, x if residual else None, tile)
    return x


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="1.5B", choices=["1.5B", "7B"])
    p.add_argument("--rows", default="1,4,8,16,32")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--out", default="decode_fused_mlp.json")
    args = p.parse_args(argv)
    tiles = [Tile(**t) for t in TILES]
    if triton is None or not torch.cuda.is_available():
        print(f"decode_fused_mlp needs a CUDA GPU and Triton; it would sweep {len(tiles)} tiles:")
        for t in tiles:
            print(" ", asdict(t))
        return
    t0 = time.time()
    torch.manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    if max(rows) > MAX_ROWS:
        raise SystemExit(f"--rows: fused_mlp serves at most {MAX_ROWS} rows")
    h, inter = SHAPES[args.model][0], SHAPES[args.model][1]
    shapes = gemm_shapes(args.model)
    assert shapes["gate_up"] == (2 * inter, h) and shapes["down"] == (h, inter), shapes
    bw = copy_bandwidth()
    ws = layer_weights(h, inter, args.layers)
    layer_bytes = 3 * inter * h * 2
    floor_us = layer_bytes / bw * 1e6
    result = {"benchmark": "decode_fused_mlp", "command": " ".join([sys.executable, *sys.argv]),
              "device": device_facts(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_gb_per_s": bw / 1e9, "model": args.model, "hidden": h, "intermediate": inter,
              "layers": args.layers, "layer_weight_mb": layer_bytes / 1e6, "floor_us_per_layer": floor_us,
              "tolerance": TOL, "weight_scale": WEIGHT_SCALE, "rows": {}}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for m in rows:
        x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
        res = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
        rec, entries = {"floor_us_per_layer": floor_us}, []
        for name, residual in (("current", True), ("current_no_residual", False)):
            us, out = graph_replay_us(partial(current_chain, x, ws, residual), reps=20)
            rec[name + "_us_per_layer"] = us / args.layers
            if residual:
                ref_chain = out.float()
                rec["current_chain_finite"] = bool(torch.isfinite(ref_chain).all())
                rec["current_chain_rms"] = ref_chain.pow(2).mean().sqrt().item()
        best = None
        for tile in tiles:
            entry = {"tile": asdict(tile), "slabs": triton.cdiv(inter, tile.block_i)}
            entry["partials_mb"] = entry["slabs"] * m * h * 4 / 1e6
            try:
                entry["rel_err"] = check(x, *ws[0], res, tile)
                us, out = graph_replay_us(partial(fused_chain, x, ws, tile, True), reps=20)
                entry["us_per_layer"] = us / args.layers
                entry["chain_finite"] = bool(torch.isfinite(out).all())
                entry["chain_rel_err_vs_current"] = rel_err(out, ref_chain)  # 28 layers of 1-ulp differences
                if entry["chain_finite"] and (best is None or us < best[0]):
                    best = (us, tile)
            except Exception as e:  # a tile the compiler refuses (shared memory, registers), or a failed check
                entry["error"] = tile_error(e)
            entries.append(entry)
        if best is not None:
            rec["best_tile"] = asdict(best[1])
            rec["fused_us_per_layer"] = best[0] / args.layers
            try:
                us, _ = graph_replay_us(partial(fused_chain, x, ws, best[1], False), reps=20)
                rec["fused_no_residual_us_per_layer"] = us / args.layers
            except Exception as e:
                rec["fused_no_residual_error"] = tile_error(e)
        write_rows(out_path, result, m, rec | {"tiles": entries}, t0)
    report_failed_tiles(out_path, result)


if __name__ == "__main__":
    main()
