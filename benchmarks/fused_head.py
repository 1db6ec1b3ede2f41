"""The chunked log-prob head's forward + backward on one GPU, by how each chunk's head-weight gradient reaches
the fp32 accumulator: `in_gemm` (training/fused_logprob.add_weight_grad on CUDA: cuBLAS sums the bf16 product
into fp32) against `product` (the [V, H] product in bf16, then an add over the fp32 gradient).

First each variant's log-probs, entropies and gradients are checked against plain PyTorch (fp32 logits,
log_softmax) on --check-rows rows; then each is timed --repeat times over --rows rows (after a warm-up):
median and spread, and the peak memory above the inputs.

  PYTHONPATH=. python benchmarks/fused_head.py [--rows 8192 --hidden 3584 --vocab 152064] --out fused_head.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import device_facts  # noqa: E402

from hybridrl.training import fused_logprob as F  # noqa: E402

VARIANTS = {"in_gemm": F._add_in_gemm, "product": F._add_product}
ORIGINAL = F.add_weight_grad


def run(rows: int, hidden: int, vocab: int, variant: str, seed: int = 0):
    torch.manual_seed(seed)
    h = (torch.randn(rows, hidden, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda") * 0.02).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (rows,), device="cuda")
    g = torch.randn(rows, 2, device="cuda")
    F.add_weight_grad = VARIANTS[variant]
    try:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = F.fused_logprob_entropy(h, w, t, 0.8, True)
        (out * g).sum().backward()
        end.record()
        torch.cuda.synchronize()
        return out.detach(), h.grad, w.grad, start.elapsed_time(end) / 1e3, (torch.cuda.max_memory_allocated() - base) / 2**30
    finally:
        F.add_weight_grad = ORIGINAL



def check(rows: int, hidden: int, vocab: int, variant: str) -> dict:
    out, gh, gw, _, _ = run(rows, hidden, vocab, variant)
    torch.manual_seed(0)
    h = (torch.randn(rows, hidden, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda") * 0.02).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (rows,), device="cuda")
    g = torch.randn(rows, 2, device="cuda")
    hf, wf = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    lp = torch.log_softmax((hf @ wf.t()) / 0.8, -1)
    ref = torch.stack([lp.gather(1, t[:, None]).squeeze(1), -(lp.exp() * lp).sum(-1)], -1)
    (ref * g).sum().backward()
    rel = lambda a, b: ((a.float() - b).abs().max() / b.abs().max()).item()  # noqa: E731
    errs = {"log_prob_entropy_max_abs": (out - ref.detach()).abs().max().item(),
            "grad_hidden_max_rel": rel(gh, hf.grad), "grad_weight_max_rel": rel(gw, wf.grad)}
    errs["ok"] = errs["log_prob_entropy_max_abs"] < 5e-2 and max(errs["grad_hidden_max_rel"],
                                                                   errs["grad_weight_max_rel"]) < 2e-2
    return errs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=3584)
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--check-rows", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    result = {"benchmark": "fused_head", "command": " ".join(["python"] + sys.argv), "device": device_facts(),
              "workload": {"rows": a.rows, "hidden": a.hidden, "vocab": a.vocab, "dtype": "bf16", "entropy": True,
                           "chunk_rows": F.chunk_rows(a.vocab)}, "variants": {}}
    for name in VARIANTS:
        entry = {"check": check(a.check_rows, a.hidden, a.vocab, name)}
        run(a.rows, a.hidden, a.vocab, name)  # warm-up
        times, peaks = zip(*[run(a.rows, a.hidden, a.vocab, name)[3:] for _ in range(a.repeat)])
        entry.update(s_each=list(times), s_median=statistics.median(times), s_min=min(times), s_max=max(times),
                     peak_extra_gb=max(peaks))
        result["variants"][name] = entry
        print(f"[fused_head] {name}: {entry['s_median'] * 1e3:.1f} ms (fwd+bwd, {a.rows} rows), "
              f"+{entry['peak_extra_gb']:.2f} GiB, check {entry['check']}", flush=True)
        torch.cuda.empty_cache()
    v = result["variants"]
    result["in_gemm_over_product"] = v["in_gemm"]["s_median"] / v["product"]["s_median"]
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
