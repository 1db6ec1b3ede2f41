"""The update's packed causal attention, forward + backward, on long-tailed GRPO micro-batches: FlashAttention-2 with
the grouped K/V heads as they are (`HYBRIDRL_GQA=native`, models/varlen_attention.py) against the default path
(torch's varlen_attn, which before torch 2.13 takes no grouped heads, so K/V are repeated to the query heads; the
record says which the installed torch did), and a candidate the model does not use yet: cuDNN's fused attention
(aten's `_cudnn_attention_forward` / `_backward` over the same ragged segments, K/V repeated to the query heads; on
Hopper cuDNN's kernels are not FlashAttention-2's). A candidate that fails or disagrees with the default path is
recorded with its error and left out of the timings.

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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from hybridrl.bench_manifest import device_facts  # noqa: E402
from hybridrl.models.varlen_attention import _varlen  # noqa: E402
from hybridrl.training.flash_segments import flash_segments, flash_varlen_attention  # noqa: E402

SHAPES = {"1.5B": dict(heads=12, kv_heads=2, head_dim=128, layers=28),
          "7B": dict(heads=28, kv_heads=4, head_dim=128, layers=28)}
VARIANTS = ("native", "auto")   # HYBRIDRL_GQA values
CANDIDATES = ("cudnn",)         # timed beside them, not a path of the model
TOLERANCE = 2e-2


def cudnn_attention(query, key, value, seg, scale):
    """flash_varlen_attention's contract ([1, H, T, D] in and out) through cuDNN, K/V repeated to the query heads."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if seg.kv_index is not None:
        k, v = k.index_select(0, seg.kv_index), v.index_select(0, seg.kv_index)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    # aten's autograd formula for this op runs cuDNN's backward
    out = torch.ops.aten._cudnn_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), None, seg.cu_q,
                                                  seg.cu_k, int(seg.max_q), int(seg.max_k), True, 0.0, True, False,
                                                  scale=float(scale))[0]
    return out.transpose(0, 1).unsqueeze(0)


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


def run_variant(mode: str, q, k, v, dout, seg, scale, reps: int):
    """A HYBRIDRL_GQA mode of the model's path, or a candidate."""
    attend = cudnn_attention if mode == "cudnn" else flash_varlen_attention
    if mode in VARIANTS:
        os.environ["HYBRIDRL_GQA"] = mode
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))

    def once():
        out = attend(q, k, v, seg, scale)
        out.backward(dout)
        return out

    out = once()
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
    return result, statistics.median(times)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def agreement(got, ref) -> dict:
    """Relative errors of (out, dq, dk, dv) against the reference's."""
    return {f"{part}_rel_err": rel_err(a, b) for part, a, b in zip(("out", "dq", "dk", "dv"), got, ref)}


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
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help="comma-separated candidates timed beside the model's paths ('' for none)")
    ap.add_argument("--out", default="varlen_attention.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("varlen_attention.py times CUDA kernels; no GPU here")
    shape, dev = SHAPES[args.shape], torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    lens = long_tailed_lengths(args.prompts * args.n, args.mean_len, args.limit, args.at_limit, gen)
    groups = [lens[i * args.n:(i + 1) * args.n] for i in range(args.prompts)]
    batches = micro_batches(args.prompt_len, groups, args.micro_tokens)
    H, K, D = shape["heads"], shape["kv_heads"], shape["head_dim"]
    scale = D ** -0.5
    candidates = [c for c in args.candidates.split(",") if c]
    unknown = set(candidates) - set(CANDIDATES)
    if unknown:
        raise SystemExit(f"--candidates: {sorted(unknown)} unknown (known: {', '.join(CANDIDATES)})")
    per_batch, checks, failed, cand_errs = [], [], {}, {}
    for i, mb in enumerate(batches):
        seg, tokens = segments_of(args.prompt_len, mb, dev)
        g = torch.Generator(device=dev).manual_seed(args.seed + i)
        q, k, v = (torch.randn(1, h, tokens, D, device=dev, dtype=torch.bfloat16, generator=g) for h in (H, K, K))
        dout = torch.randn(1, H, tokens, D, device=dev, dtype=torch.bfloat16, generator=g)
        results, secs = {}, {}
        for mode in VARIANTS:
            results[mode], secs[mode] = run_variant(mode, q, k, v, dout, seg, scale, args.reps)
        checks.append(agreement(results["native"], results["auto"]))
        for name in candidates:
            if name in failed:
                continue
            try:
                got, secs[name] = run_variant(name, q, k, v, dout, seg, scale, args.reps)
            except RuntimeError as e:   # unsupported shape, layout or backend: recorded, not timed
                failed[name] = f"micro-batch {i}: {type(e).__name__}: {str(e)[:300]}"
                continue
            errs = agreement(got, results["auto"])
            worst_c = max(errs.values())
            if worst_c >= TOLERANCE:
                failed[name] = f"micro-batch {i}: disagrees with the default path: {errs}"
            cand_errs.setdefault(name, []).append(worst_c)
        per_batch.append({"tokens": tokens, "samples": sum(len(x) for x in mb), **{f"{n}_s": s for n, s in secs.items()}})
        del q, k, v, dout, results
    os.environ.pop("HYBRIDRL_GQA", None)
    worst = {key: max(c[key] for c in checks) for key in checks[0]}
    ok = all(v < TOLERANCE for v in worst.values())
    timed = [*VARIANTS, *(c for c in candidates if c not in failed)]
    totals = {name: shape["layers"] * sum(b[f"{name}_s"] for b in per_batch) for name in timed}
    report = {
        "benchmark": "varlen_attention",
        "command": "python " + " ".join(sys.argv),
        "device": device_facts(),
        "workload": vars(args) | {"shape_dims": shape},
        "lengths": {"mean": statistics.mean(lens), "median": statistics.median(lens), "max": max(lens),
                    "at_limit": sum(x >= args.limit for x in lens) / len(lens)},
        "micro_batches": per_batch,
        "check": {"worst_rel_err": worst, "passed": ok, "tolerance": TOLERANCE},
        "candidates": {name: {"worst_rel_err_vs_auto": max(cand_errs.get(name, [float("nan")])),
                              "failed": failed.get(name)} for name in candidates},
        "auto_path": "varlen_attn with enable_gqa" if "enable_gqa" in _varlen()[1] else "varlen_attn, K/V repeated",
        "update_attention_s": totals,
        "native_vs_auto": totals["native"] / totals["auto"],
        **{f"{name}_vs_auto": totals[name] / totals["auto"] for name in timed if name not in VARIANTS},
        "note": "forward + backward of one layer's attention per micro-batch (K/V gather for shared prompts "
                "included), median of reps, times the layers; the update's other work is not in it",
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("lengths", "check", "candidates", "auto_path", "update_attention_s",
                                             "native_vs_auto")}, indent=1))
    if not ok:
        raise SystemExit(f"the two variants disagree: {worst}")


if __name__ == "__main__":
    main()
