"""The update's packed causal attention, forward + backward, on long-tailed GRPO micro-batches, in the variants
models/varlen_attention.py can run (--variants; the first is the reference the others are checked against):
- `fa2`: FlashAttention-2 with the grouped K/V heads as they are (`HYBRIDRL_FLASH=fa2 HYBRIDRL_GQA=native`);
- `fa2_varlen_attn`: torch's public varlen_attn (`HYBRIDRL_GQA=varlen_attn`, which before torch 2.13 takes no grouped
  heads, so K/V are repeated to the query heads; the record says which the installed torch did);
- `fa4`: FlashAttention-4's CuTe kernels (`HYBRIDRL_FLASH=fa4`; the `fa4` extra installed, a Hopper / Blackwell GPU).

Workload: P prompts x n samples, prompt length fixed, response lengths long-tailed (exponential with the given mean,
a share forced to the limit), packed as the trainer packs them with shared prompts (each prompt once per
micro-batch, its responses attending to it: training/flash_segments.py) into micro-batches of at most
--micro-tokens tokens, whole groups per micro-batch. One layer's attention per micro-batch is timed (CUDA events,
median of --reps) and multiplied by the model's layers: the update's attention time per step, both variants in one
run. Checked first: the two variants' outputs and q/k/v gradients agree within bf16 tolerance on every
micro-batch's first replay.

  PYTHONPATH=. python benchmarks/varlen_attention.py --shape 1.5B --out varlen_attention_1.5b.json
  PYTHONPATH=. python benchmarks/varlen_attention.py --shape 7B --prompts 16 --limit 16384 --mean-len 3500 \
      --at-limit 0.023 --micro-tokens 16640 --out varlen_attention_7b.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from hybridrl.bench_manifest import device_facts  # noqa: E402
from hybridrl.models.varlen_attention import _varlen  # noqa: E402
from hybridrl.training.flash_segments import flash_segments, flash_varlen_attention  # noqa: E402

SHAPES = {"1.5B": dict(heads=12, kv_heads=2, head_dim=128, layers=28),
          "7B": dict(heads=28, kv_heads=4, head_dim=128, layers=28)}
VARIANTS = {"fa2": {"HYBRIDRL_FLASH": "fa2", "HYBRIDRL_GQA": "native"},
            "fa2_varlen_attn": {"HYBRIDRL_FLASH": "fa2", "HYBRIDRL_GQA": "varlen_attn"},
            "fa4": {"HYBRIDRL_FLASH": "fa4"}}
TOLERANCE = 2e-2



def long_tailed_lengths(count: int, mean: float, limit: int, at_limit: float, gen: torch.Generator) -> list[int]:
    lens = torch.empty(count).exponential_(1.0 / mean, generator=gen).ceil().clamp(1, limit)
    forced = torch.rand(count, generator=gen) < at_limit
    return torch.where(forced, torch.tensor(float(limit)), lens).long().tolist()


def micro_batches(prompt_len: int, groups: list[list[int]], budget: int) -> list[list[list[int]]]:
    """Whole groups in order, each micro-batch at most `budget` tokens (a group larger than it goes alone)."""
    out, cur, used = [], [], 0
    for g in groups:
        size = prompt_len + sum(g)
        if cur and used + size > budget:
            out.append(cur)
            cur, used = [], 0
        cur.append(g)
        used += size
    return out + ([cur] if cur else [])


def segments_of(prompt_len: int, groups: list[list[int]], device):
    """The packed row's FlashSegments: documents [prompt, r_1 .. r_n], one segment id per prompt / response run."""
    doc_lens, seg_ids, is_prompt, run = [], [], [], 0
    for g in groups:
        doc_lens.append(prompt_len + sum(g))
        for length, prompt in [(prompt_len, True)] + [(r, False) for r in g]:
            seg_ids += [run] * length
            is_prompt += [prompt] * length
            run += 1
    cu = torch.nn.functional.pad(torch.tensor(doc_lens).cumsum(0), (1, 0)).to(torch.int32)
    seg = flash_segments(cu, torch.tensor(seg_ids), torch.tensor(is_prompt))
    return seg.to(device), len(seg_ids)


def run_variant(name: str, q, k, v, dout, seg, scale, reps: int):
    """One variant: its first replay's (out, dq, dk, dv), that replay's seconds (compilation included) and the
    median time of `reps` more."""
    for key in ("HYBRIDRL_FLASH", "HYBRIDRL_GQA"):
        os.environ.pop(key, None)
    os.environ.update(VARIANTS[name])
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))

    def once():
        out = flash_varlen_attention(q, k, v, seg, scale)
        out.backward(dout)
        return out

    t0 = time.perf_counter()
    out = once()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    result = (out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float())
    times = []
    for _ in range(reps):
        q.grad = k.grad = v.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        once()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return result, first_s, statistics.median(times)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1.5B", choices=sorted(SHAPES))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--mean-len", type=float, default=900.0)
    ap.add_argument("--limit", type=int, default=4096)
    ap.add_argument("--at-limit", type=float, default=0.06, help="share of responses forced to the limit")
    ap.add_argument("--micro-tokens", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="fa2,fa2_varlen_attn",
                    help=f"comma-separated, the first the reference; of {', '.join(VARIANTS)}")
    ap.add_argument("--out", default="varlen_attention.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("varlen_attention.py times CUDA kernels; no GPU here")
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or len(names) < 2:
        raise SystemExit(f"--variants {args.variants!r}: name two or more of {', '.join(VARIANTS)}")
    shape, dev = SHAPES[args.shape], torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    lens = long_tailed_lengths(args.prompts * args.n, args.mean_len, args.limit, args.at_limit, gen)
    groups = [lens[i * args.n:(i + 1) * args.n] for i in range(args.prompts)]
    batches = micro_batches(args.prompt_len, groups, args.micro_tokens)
    H, K, D = shape["heads"], shape["kv_heads"], shape["head_dim"]
    scale = D ** -0.5
    per_batch, checks = [], []
    for i, mb in enumerate(batches):
        seg, tokens = segments_of(args.prompt_len, mb, dev)
        g = torch.Generator(device=dev).manual_seed(args.seed + i)
        q, k, v = (torch.randn(1, h, tokens, D, device=dev, dtype=torch.bfloat16, generator=g) for h in (H, K, K))
        dout = torch.randn(1, H, tokens, D, device=dev, dtype=torch.bfloat16, generator=g)
        results, secs, first = {}, {}, {}
        for name in names:
            results[name], first[name], secs[name] = run_variant(name, q, k, v, dout, seg, scale, args.reps)
        for name in names[1:]:
            checks.append({f"{name}_{part}_rel_err": rel_err(a, b) for part, a, b in
                           zip(("out", "dq", "dk", "dv"), results[name], results[names[0]])})
        per_batch.append({"tokens": tokens, "samples": sum(len(x) for x in mb), **{f"{n}_s": s for n, s in secs.items()},
                          **{f"{n}_first_s": s for n, s in first.items()}})
        del q, k, v, dout, results
    for key in ("HYBRIDRL_FLASH", "HYBRIDRL_GQA"):
        os.environ.pop(key, None)
    worst = {key: max(c[key] for c in checks if key in c) for key in {k for c in checks for k in c}}
    ok = all(v < TOLERANCE for v in worst.values())
    totals = {name: shape["layers"] * sum(b[f"{name}_s"] for b in per_batch) for name in names}
    report = {
        "benchmark": "varlen_attention",
        "command": "python " + " ".join(sys.argv),
        "device": device_facts(),
        "workload": vars(args) | {"shape_dims": shape},
        "lengths": {"mean": statistics.mean(lens), "median": statistics.median(lens), "max": max(lens),
                    "at_limit": sum(x >= args.limit for x in lens) / len(lens)},
        "micro_batches": per_batch,
        "check": {"worst_rel_err": worst, "passed": ok, "tolerance": TOLERANCE},
        "varlen_attn_path": "with enable_gqa" if "enable_gqa" in _varlen()[1] else "K/V repeated to the query heads",
        "update_attention_s": totals,
        "vs_reference": {name: totals[name] / totals[names[0]] for name in names[1:]},
        "note": "forward + backward of one layer's attention per micro-batch (K/V gather for shared prompts "
                "included), median of reps, times the layers; the update's other work is not in it",
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("lengths", "check", "varlen_attn_path", "update_attention_s",
                                             "vs_reference")}, indent=1))
    if not ok:
        raise SystemExit(f"the variants disagree with {names[0]}: {worst}")


if __name__ == "__main__":
    main()
