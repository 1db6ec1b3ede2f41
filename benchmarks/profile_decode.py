"""Where a decode step's GPU time goes, against the floors it cannot beat (one GPU, random weights).

Runs the native engine eagerly (CUDA graphs hide the kernels from the profiler) on the rollout
benchmark's workload (batch 256, 256-token prompts), profiles a window of decode steps with
torch.profiler and groups kernel time per step into gemm / attention / sampler / other. Next to it:
- the same engine with CUDA graphs: measured ms per decode step (host clocks, rollout.py's split);
- cuBLAS alone on the step's GEMM shapes (every linear layer + LM head at M = batch): the GEMM floor
  as this GPU's library achieves it, in ms and TFLOP/s;
- the byte floor of a step: weights read once + the KV read at the mean context, over the HBM
  bandwidth measured by a device-to-device copy.

  PYTHONPATH=. python benchmarks/profile_decode.py [--model 7B] [--batch 256] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from rollout import qwen_config, timed  # noqa: E402

from hybridrl.rollout.config import EngineConfig  # noqa: E402
from hybridrl.rollout.engine import LLMEngine  # noqa: E402
from hybridrl.rollout.sampling_params import SamplingParams  # noqa: E402


def category(name: str) -> str:
    n = name.lower()
    if "paged_decode" in n:
        return "attention"
    if any(s in n for s in ("gemm", "sm90", "cutlass", "nvjet", "ampere", "xmma", "splitk")):
        return "gemm"
    if any(s in n for s in ("sample", "softmax", "argmax", "exponential", "reduce")):
        return "sampler"
    return "other"


def engine_for(cfg, args, eager):
    config = EngineConfig(dtype=torch.bfloat16, max_model_len=args.prompt_len + args.new_tokens + 16,
                          max_num_seqs=args.batch, gpu_memory_utilization=0.5, enforce_eager=eager)
    return LLMEngine(cfg, config, device="cuda")


def load(engine, state):
    engine.wake_up(("weights",))
    engine.load_weights(state.items())
    engine.wake_up(("kv_cache",))


def profile_eager(cfg, state, prompts, args):
    engine = engine_for(cfg, args, eager=True)
    load(engine, state)
    runner, seen = engine.runner, {"decode": 0}
    prof = profile(activities=[ProfilerActivity.CUDA])
    inner = runner.launch   # every step goes through launch (async scheduling launches a step ahead of its read)
    lo, hi = args.skip_steps, args.skip_steps + args.profile_steps

    def launch(batch, *a, **k):
        if not batch.is_prefill:
            if seen["decode"] == lo:
                torch.cuda.synchronize()
                prof.start()
            elif seen["decode"] == hi:
                torch.cuda.synchronize()
                prof.stop()
            seen["decode"] += 1
        return inner(batch, *a, **k)

    runner.launch = launch
    engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=hi + 2, ignore_eos=True, seed=0))
    per_cat, per_kernel = defaultdict(float), defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t and ev.key and not ev.key.startswith(("cudaLaunch", "cudaStream", "cudaMemcpy", "ProfilerStep")):
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[ev.key] += t / 1e3 / args.profile_steps
                per_cat[category(ev.key)] += t / 1e3 / args.profile_steps
    engine.sleep()
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:25]
    return {"ms_per_step_by_category": dict(per_cat), "kernel_ms_per_step": sum(per_cat.values()),
            "top_kernels_ms_per_step": top}


def graph_step_ms(cfg, state, prompts, args):
    engine = engine_for(cfg, args, eager=False)
    load(engine, state)
    engine.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True, seed=0))
    engine.reset_stats()
    engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True, seed=0))
    st = engine.stats
    engine.sleep()
    return 1e3 * (st["decode_launch_s"] + st["decode_wait_s"]) / st["num_decode_steps"]


def gemm_floor(cfg, batch, warmup=10, reps=50):
    """cuBLAS alone on the step's GEMM shapes, CUDA-event timed after `warmup` calls per shape. (A first version
    warmed up once and timed a Python loop: three of five shapes came out at 70-120 TFLOP/s, 5x below the same
    shapes inside the profiled step; committed results from before that fix say so.)"""
    h, i, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd = h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"qkv": (h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * i), "down": (i, h)}
    out, total_ms, flops = {}, 0.0, 0
    for name, (k, n) in [*shapes.items(), ("lm_head", (h, V))]:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(warmup):
            F.linear(x, w)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            F.linear(x, w)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / reps
        count = 1 if name == "lm_head" else cfg.num_hidden_layers
        out[name] = {"ms": ms, "tflops": 2 * batch * k * n / (ms / 1e3) / 1e12, "times_per_step": count}
        total_ms += ms * count
        flops += 2 * batch * k * n * count
        del w, x
    return {"per_gemm": out, "gemm_ms_per_step": total_ms, "step_gflop": flops / 1e9,
            "tflops": flops / (total_ms / 1e3) / 1e12}


def byte_floor(cfg, state, batch, mean_ctx):
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    _, s = timed(lambda: [y.copy_(x) for _ in range(5)])
    bw = 2 * x.numel() * 5 / s  # read + write
    weight_bytes = sum(t.numel() * t.element_size() for k, t in state.items() if "embed_tokens" not in k)
    hd = cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = batch * mean_ctx * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * hd * 2
    return {"hbm_copy_gb_s": bw / 1e9, "weight_gb": weight_bytes / 1e9, "kv_gb_mean": kv_bytes / 1e9,
            "byte_floor_ms": 1e3 * (weight_bytes + kv_bytes) / bw}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="7B")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--skip-steps", type=int, default=100)
    ap.add_argument("--profile-steps", type=int, default=20)
    ap.add_argument("--fused-mlp-max-rows", type=int, default=None,
                    help="the most rows the engine's fused decode MLP takes (models/fused_mlp.ENGINE_MAX_ROWS; "
                         "HYBRIDRL_FUSED_MLP=0 turns it off)")
    ap.add_argument("--out", default="benchmarks/results/profile_decode.json")
    args = ap.parse_args()
    if args.fused_mlp_max_rows is not None:
        from hybridrl.models import fused_mlp
        fused_mlp.ENGINE_MAX_ROWS = args.fused_mlp_max_rows
    import transformers

    cfg = qwen_config(args.model)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    state = model.state_dict()
    prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len),
                            generator=torch.Generator().manual_seed(0)).tolist()
    mean_ctx = args.prompt_len + args.skip_steps + args.profile_steps // 2
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "workload": vars(args), "mean_context_in_window": mean_ctx,
           "eager_profile": profile_eager(cfg, state, prompts, args),
           "graph_decode_ms_per_step": graph_step_ms(cfg, state, prompts, args),
           "gemm_floor": gemm_floor(cfg, args.batch), "byte_floor": byte_floor(cfg, state, args.batch, mean_ctx)}
    print(json.dumps(res, indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
