"""Cascade decode attention against the per-row kernel, one layer's K/V, on the shapes a GRPO rollout passes through.

Each case: `rows` sequences in groups of `n` consecutive rows sharing a `prefix`-token prompt (its blocks shared, as
the engine forks them), each row with its own ~`own` tokens after it (uniform in [own/2, 3 own/2]). Both paths are
checked against the torch reference (bf16 tolerance), then timed as the engine runs them: 20 calls captured in one
CUDA graph, replayed, GPU time per call from CUDA events; median of 5 timings (each the median of 10 replays). Reported: microseconds a layer, the
K/V bytes each path must read (the cascade reads each prefix once per group), the prefixes' K/V a layer against the
GPU's L2, the speedup, and what rollout/shared_prefix.py's `use_cascade` chooses for the case (its MIN_L2_FRACTION
is set from these rows).

  python benchmarks/cascade_decode.py --out OUT.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_gemm import graph_replay_us  # noqa: E402

from hybridrl.rollout.attention import paged_decode_reference  # noqa: E402
from hybridrl.rollout.shared_prefix import (  # noqa: E402
    SharedPrefix,
    find_prefix_groups,
    prefix_members,
    use_cascade,
)

HEADS = {"1.5B": (12, 2, 128), "7B": (28, 4, 128)}
# (rows, n, prefix tokens, own tokens): a long-tailed rollout of 256-token prompts from full width to its tail; the
# prompt length swept at full width; wider groups; fewer rows with long prompts
CASES = [(256, 8, 256, 64), (256, 8, 256, 1000), (64, 8, 256, 2000), (32, 8, 256, 3000), (8, 2, 64, 3000),
         (256, 8, 512, 500), (256, 8, 1024, 500), (256, 8, 2048, 500), (256, 8, 4096, 500), (256, 8, 2048, 2000),
         (256, 16, 1024, 500), (256, 16, 2048, 500), (64, 8, 2048, 1000), (64, 8, 4096, 1000), (64, 4, 512, 500)]
PAGE = 16


def build(rows, n, prefix, own, N, K, D, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    pb = prefix // PAGE
    lens = [prefix + max(1, int(own * (0.5 + torch.rand(1, generator=g).item()))) for _ in range(rows)]
    width = max(-(-x // PAGE) for x in lens)
    groups = -(-rows // n)
    NB = groups * pb + rows * width + 1
    perm = torch.randperm(NB, generator=g).tolist()
    tables = []
    for gi in range(groups):
        shared = [perm.pop() for _ in range(pb)]
        for _ in range(gi * n, min(rows, (gi + 1) * n)):
            tables.append(shared + [perm.pop() for _ in range(width - pb)])
    q = torch.randn(rows, N, D, device=device, dtype=torch.bfloat16)
    kc = torch.randn(NB, PAGE, K, D, device=device, dtype=torch.bfloat16)
    vc = torch.randn(NB, PAGE, K, D, device=device, dtype=torch.bfloat16)
    bt = torch.tensor(tables, dtype=torch.int32, device=device)
    cl = torch.tensor(lens, dtype=torch.int32, device=device)
    found = find_prefix_groups(tables, lens, PAGE, prefix_members(N // K))
    G = max(1, rows // 2)
    first = torch.zeros(G, dtype=torch.long)
    count = torch.zeros(G, dtype=torch.long)
    for i, (f, c) in enumerate(found.groups):
        first[i], count[i] = f, c
    prefix_t = SharedPrefix(torch.tensor(found.lens, device=device), first.to(device), count.to(device))
    return q, kc, vc, bt, cl, lens, found, prefix_t


def graph_time_us(fn, calls: int = 20, repeats: int = 5) -> tuple[float, float, float]:
    """µs per call of fn() over a CUDA graph of `calls` calls (decode_gemm.graph_replay_us): the median of
    `repeats` timings and their range."""
    times = [graph_replay_us(lambda: [fn() for _ in range(calls)], reps=10)[0] / calls for _ in range(repeats)]
    return statistics.median(times), min(times), max(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="1.5B,7B")
    args = p.parse_args()
    from hybridrl.rollout.triton_decode import paged_decode_triton

    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {"benchmark": "cascade_decode", "command": " ".join(sys.argv),
           "device": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "l2_mb": l2 / 1e6},
           "page": PAGE, "cases": []}
    for model in args.models.split(","):
        N, K, D = HEADS[model]
        kv_token = 2 * K * D * 2
        for rows, n, prefix, own in CASES:
            q, kc, vc, bt, cl, lens, found, prefix_t = build(rows, n, prefix, own, N, K, D, dev)
            scale = D ** -0.5
            ref = paged_decode_reference(q, kc, vc, bt, cl, scale).float()
            plain = paged_decode_triton(q, kc, vc, bt, cl, scale).float()
            casc = paged_decode_triton(q, kc, vc, bt, cl, scale, prefix=prefix_t).float()
            err = {"plain": (plain - ref).abs().max().item(), "cascade": (casc - ref).abs().max().item()}
            ok = all(torch.allclose(x, ref, atol=2e-2, rtol=2e-2) for x in (plain, casc))
            call = functools.partial(paged_decode_triton, q, kc, vc, bt, cl, scale)
            t_plain = graph_time_us(call)
            t_casc = graph_time_us(functools.partial(call, prefix=prefix_t))
            total = sum(lens)
            row = {"model": model, "heads": [N, K, D], "rows": rows, "n": n, "prefix": prefix, "own": own,
                   "groups": len(found.groups), "saved_tokens": found.saved_tokens,
                   "prefix_mb": sum(found.lens[f] for f, _ in found.groups) * kv_token / 1e6,
                   "use_cascade": use_cascade(found, kv_token, l2),
                   "saved_mb": found.saved_tokens * kv_token / 1e6, "kv_mb_plain": total * kv_token / 1e6,
                   "kv_mb_cascade": (total - found.saved_tokens) * kv_token / 1e6,
                   "plain_us": t_plain[0], "plain_us_range": t_plain[1:], "cascade_us": t_casc[0],
                   "cascade_us_range": t_casc[1:], "speedup": t_plain[0] / t_casc[0],
                   "max_abs_err": err, "matches_reference": ok}
            out["cases"].append(row)
            print(json.dumps({k: row[k] for k in ("model", "rows", "n", "prefix", "own", "prefix_mb", "plain_us",
                                                   "cascade_us", "speedup", "use_cascade",
                                                   "matches_reference")}), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
