"""Optimizer offload between the GPU and host memory: AdamW state of a real model's parameter shapes moved to the
host and back, through hybridrl's offload (pinned host buffers kept across offloads) and through the previous
form (`.to("cpu")` into fresh pageable memory, `.to(cuda, non_blocking=True)` back), timed each way.

  python benchmarks/optimizer_offload.py --presets qwen2.5-1.5b,qwen2.5-7b --repeat 3 --pageable-presets qwen2.5-1.5b \
      --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import device_facts  # noqa: E402

from hybridrl.assets.tiny_model import SIZE_PRESETS, make_config  # noqa: E402
from hybridrl.training.offload import load_optimizer, offload_optimizer  # noqa: E402


def shapes(preset: str) -> list[tuple[int, ...]]:
    """The decoder's parameter shapes of a size preset (no weights built)."""
    import transformers

    spec = dict(SIZE_PRESETS[preset])
    config = make_config(spec.pop("arch"), **spec)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return [tuple(p.shape) for p in model.parameters()]


def adamw_with_state(preset: str) -> torch.optim.AdamW:
    params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in shapes(preset)]
    opt = torch.optim.AdamW(params, lr=1e-6, fused=True)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()   # creates exp_avg and exp_avg_sq
    for p in params:
        p.grad = None
    return opt


def pageable_offload(opt):
    for s in opt.state.values():
        for k, v in s.items():
            if k != "step":
                s[k] = v.to("cpu")
    torch.cuda.empty_cache()


def pageable_load(opt):
    for s in opt.state.values():
        for k, v in s.items():
            if k != "step":
                s[k] = v.to("cuda", non_blocking=True)


def timed(fn, opt) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(opt)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(preset: str, form: str, repeat: int) -> dict:
    opt = adamw_with_state(preset)
    state_gb = sum(v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items()
                   if k != "step") / 1e9
    out_fn, in_fn = (offload_optimizer, lambda o: load_optimizer(o, "cuda")) if form == "pinned" else (
        pageable_offload, pageable_load)
    runs = [(timed(out_fn, opt), timed(in_fn, opt)) for _ in range(repeat + (form == "pinned"))]
    first = runs.pop(0) if form == "pinned" else None   # the first pinned offload allocates and pins its buffers
    offs, loads = [r[0] for r in runs], [r[1] for r in runs]
    row = {"preset": preset, "form": form, "state_gb": state_gb, "offload_s": offs, "load_s": loads,
           "offload_s_median": statistics.median(offs), "load_s_median": statistics.median(loads),
           "offload_gb_per_s": state_gb / statistics.median(offs), "load_gb_per_s": state_gb / statistics.median(loads)}
    if first:
        row["first_offload_s"], row["first_load_s"] = first
        # the pinned buffers holding the twins (views share them): what the run keeps pinned in host memory
        from hybridrl.training.offload import _HOST_TWINS
        buffers = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _HOST_TWINS[opt].values()}
        row["pinned_buffers"], row["pinned_gb"] = len(buffers), sum(buffers.values()) / 1e9
    del opt
    torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="qwen2.5-1.5b,qwen2.5-7b")
    p.add_argument("--pageable-presets", default="qwen2.5-1.5b", help="presets also timed in the previous form")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    rows = [measure(pr, "pageable", a.repeat) for pr in a.pageable_presets.split(",") if pr]
    rows += [measure(pr, "pinned", a.repeat) for pr in a.presets.split(",") if pr]
    Path(a.out).write_text(json.dumps({"benchmark": "optimizer_offload", "device": device_facts(),
                                       "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
                                       "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
