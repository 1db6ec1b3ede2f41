"""The chunked log-prob head's forward + backward on one GPU, by variant:
  in_gemm            training/fused_logprob's torch path (HYBRIDRL_FUSED=0) with an entropy bonus in the loss:
                     each chunk's head-weight gradient summed into the fp32 accumulator inside cuBLAS
                     (add_weight_grad on CUDA)
  product            the same through the [V, H] product in bf16, then an add over the fp32 gradient
  entropy_detached   in_gemm with the entropy measured but not in the loss (entropy_coeff = 0, the default):
                     backward skips the entropy term
  entropy_detached_chunk_MB   the same with chunks of MB MiB of fp32 logits (default CHUNK_BYTES = 256)
  triton, triton_entropy_detached   in_gemm and entropy_detached through the Triton kernels
                     (training/triton_logprob.py), as the update runs them on CUDA, at their own chunk size
                     (KERNEL_CHUNK_BYTES of 16-bit logits: 4x the torch path's rows)
  triton_entropy_detached_chunk_128   the same with chunks of 128 MiB of 16-bit logits (the torch path's rows)
  gemm_only          the four GEMMs of each chunk alone (forward, recompute, the two gradients), at the torch
                     path's and at the kernel path's chunk rows: the floor the elementwise work sits on

First each variant's log-probs, entropies and gradients are checked against plain PyTorch (fp32 logits,
log_softmax) on --check-rows rows; then each is timed --repeat times over --rows rows (after a warm-up):
median and spread, and the peak memory above the inputs.

  PYTHONPATH=. python benchmarks/fused_head.py [--rows 8192 --hidden 3584 --vocab 152064] --out fused_head.json

triton_over_in_gemm and triton_entropy_detached_over_entropy_detached in the JSON: the kernels' time over the
torch path's, entropy in the loss and not.
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
from grpo_step import device_facts  # noqa: E402

from hybridrl.algorithms import chunked_logprob as C  # noqa: E402
from hybridrl.training import fused_logprob as F  # noqa: E402

# name -> (weight-gradient path, chunk bytes (the path's own: fp32 or 16-bit logits) or None for the default,
#          entropy carries a gradient, Triton kernels)
VARIANTS = {"in_gemm": (F._add_in_gemm, None, True, False), "product": (F._add_product, None, True, False),
            "entropy_detached": (F._add_in_gemm, None, False, False),
            "entropy_detached_chunk_512": (F._add_in_gemm, 512 << 20, False, False),
            "entropy_detached_chunk_1024": (F._add_in_gemm, 1024 << 20, False, False),
            "triton": (F._add_in_gemm, None, True, True),
            "triton_entropy_detached": (F._add_in_gemm, None, False, True),
            "triton_entropy_detached_chunk_128": (F._add_in_gemm, 128 << 20, False, True)}
ORIGINAL = (F.add_weight_grad, C.CHUNK_BYTES, C.KERNEL_CHUNK_BYTES)


def inputs(rows: int, hidden: int, vocab: int, seed: int = 0):
    torch.manual_seed(seed)
    h = (torch.randn(rows, hidden, device="cuda") * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda") * 0.02).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (rows,), device="cuda")
    g = torch.randn(rows, 2, device="cuda")
    return h, w, t, g


def timed(fn):
    """(fn's result, seconds on the GPU, peak GiB above what was allocated before)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    torch.cuda.synchronize()
    return result, start.elapsed_time(end) / 1e3, (torch.cuda.max_memory_allocated() - base) / 2**30


def run(rows: int, hidden: int, vocab: int, variant: str, seed: int = 0):
    h, w, t, g = inputs(rows, hidden, vocab, seed)
    add, chunk_bytes, entropy_grad, kernels = VARIANTS[variant]

    def step():
        out = F.fused_logprob_entropy(h, w, t, 0.8, True, entropy_grad)
        (out * g).sum().backward()
        return out.detach()
    F.add_weight_grad = add
    if kernels:
        C.KERNEL_CHUNK_BYTES = chunk_bytes or ORIGINAL[2]
    else:
        C.CHUNK_BYTES = chunk_bytes or ORIGINAL[1]
    os.environ["HYBRIDRL_FUSED"] = "1" if kernels else "0"
    try:
        if (F._HeadLogits.kernels((h, w)) is not None) != kernels:   # never time the other path under this name
            raise RuntimeError(f"{variant}: the Triton kernels are {'not ' if kernels else ''}in use")
        out, seconds, peak = timed(step)
        return out, h.grad, w.grad, seconds, peak
    finally:
        F.add_weight_grad, C.CHUNK_BYTES, C.KERNEL_CHUNK_BYTES = ORIGINAL
        os.environ.pop("HYBRIDRL_FUSED")


def gemm_only(rows: int, hidden: int, vocab: int, kernels: bool = False) -> float:
    """Seconds of the default chunks' four GEMMs (the torch path's or the kernel path's chunk rows): logits
    (forward and again in backward), grad_h, grad_w."""
    h, w, _, _ = inputs(rows, hidden, vocab)
    h, w = h.detach(), w.detach()
    step = C.chunk_rows(vocab, kernels=kernels)
    grad_w = torch.zeros(w.shape, dtype=torch.float32, device="cuda")
    grad_h = torch.empty_like(h)

    def gemms():
        for s in range(0, rows, step):
            z = h[s:s + step] @ w.t()
            dz = h[s:s + step] @ w.t()
            grad_h[s:s + step] = dz @ w
            F._add_in_gemm(grad_w, dz, h[s:s + step])
        return z
    gemms()
    return timed(gemms)[1]


def check(rows: int, hidden: int, vocab: int, variant: str) -> dict:
    out, gh, gw, _, _ = run(rows, hidden, vocab, variant)
    h, w, t, g = inputs(rows, hidden, vocab)
    hf, wf = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    lp = torch.log_softmax((hf @ wf.t()) / 0.8, -1)
    ref = torch.stack([lp.gather(1, t[:, None]).squeeze(1), -(lp.exp() * lp).sum(-1)], -1)
    if not VARIANTS[variant][2]:
        ref = torch.stack([ref[:, 0], ref[:, 1].detach()], -1)
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
                           "temperature": 0.8, "default_chunk_rows": C.chunk_rows(a.vocab),
                           "kernel_chunk_rows": C.chunk_rows(a.vocab, kernels=True)}, "variants": {}}
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
    for name, kernels in (("gemm_only", False), ("gemm_only_kernel_chunks", True)):
        gemm_s = sorted(gemm_only(a.rows, a.hidden, a.vocab, kernels) for _ in range(a.repeat))
        result[name] = {"s_each": gemm_s, "s_median": statistics.median(gemm_s)}
        print(f"[fused_head] {name}: {result[name]['s_median'] * 1e3:.1f} ms", flush=True)
    v = result["variants"]
    result["in_gemm_over_product"] = v["in_gemm"]["s_median"] / v["product"]["s_median"]
    result["entropy_detached_over_in_gemm"] = v["entropy_detached"]["s_median"] / v["in_gemm"]["s_median"]
    result["triton_over_in_gemm"] = v["triton"]["s_median"] / v["in_gemm"]["s_median"]
    result["triton_entropy_detached_over_entropy_detached"] = (v["triton_entropy_detached"]["s_median"]
                                                               / v["entropy_detached"]["s_median"])
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
