"""Decode at long context and small batch against its bandwidth floor (one GPU, random weights, bf16).

A decode step must read the engine's weights once and every live sequence's K/V once; at B sequences of
context C that is weight_bytes + B * C * kv_bytes_per_token, over the HBM bandwidth (measured here by a
device-to-device copy). Measured side by side in one run:
- attention alone (the paged Triton kernel), single pass vs split over the context, B x C grid, against the
  K/V bytes floor;
- the plain sampler alone (noise + one pass over the logits), single pass vs split over the vocabulary;
- whole engine decode steps with CUDA graphs (host clocks: launch + wait per step, i.e. what a step costs the
  rollout), at the defaults and with both kernels forced to a single pass (the kernels before splitting),
  against weights + live K/V over the bandwidth; and with async scheduling (step t+1 launched before step t is
  read, so the host's per-step work hides behind the GPU).

  PYTHONPATH=. python benchmarks/decode_floor.py [--model 1.5B] [--out PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from rollout import SHAPES  # noqa: E402

ATTN_GRID = [(1, 4096), (4, 4096), (16, 4096), (64, 4096), (256, 1024), (256, 4096), (1, 16384), (8, 16384),
             (32, 16384)]
SAMPLER_ROWS = [1, 4, 16, 64, 256]
ENGINE_GRID = [(256, 1024), (64, 4096), (8, 4096), (8, 16384), (1, 16384)]   # (sequences, context)


def bench(fn, reps: int = 50) -> float:
    """Median ms of fn over reps CUDA-event-timed calls after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def device_ceilings() -> dict:
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), 20)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = bench(lambda: a @ a, 20)
    return {"copy_gb_per_s": 2 * (2 << 30) / ms / 1e6, "bf16_matmul_tflops": 2 * 8192**3 / mm / 1e9}


def attention_grid(shape, bw: float) -> list[dict]:
    from hybridrl.rollout import triton_decode as td

    _, _, _, N, K, _ = shape
    D, page, rows = 128, 16, []
    for B, C in ATTN_GRID:
        width = C // page
        kc = torch.randn(B * width + 1, page, K, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        q = torch.randn(B, N, D, device="cuda", dtype=torch.bfloat16)
        tables = torch.randperm(B * width, device="cuda").view(B, width).int()
        lens = torch.full((B,), C, device="cuda", dtype=torch.int32)
        floor_ms = 2 * B * C * K * D * 2 / bw * 1e3
        attend = functools.partial(td.paged_decode_triton, q, kc, vc, tables, lens, D**-0.5)
        one, auto = bench(functools.partial(attend, num_splits=1)), bench(attend)
        splits = td.decode_splits(B, K, C, td.num_sms(0))
        rows.append({"batch": B, "context": C, "splits": splits, "single_pass_ms": one, "split_ms": auto,
                     "kv_floor_ms": floor_ms, "split_vs_floor": auto / floor_ms, "speedup": one / auto})
        print("[attention]", json.dumps(rows[-1]), flush=True)
    return rows


def sampler_grid(vocab: int, bw: float) -> list[dict]:
    from hybridrl.rollout.triton_decode import num_sms
    from hybridrl.rollout.triton_sample import sample_plain, vocab_splits

    rows = []
    gen = torch.Generator("cuda").manual_seed(0)
    for B in SAMPLER_ROWS:
        logits = torch.randn(B, vocab, device="cuda").to(torch.bfloat16)
        temp = torch.ones(B, device="cuda")
        draw = functools.partial(sample_plain, logits, temp, gen)
        one, auto = bench(functools.partial(draw, splits=1)), bench(draw)
        floor_ms = B * vocab * (2 + 4 + 4) / bw * 1e3  # logits read, noise written and read
        rows.append({"rows": B, "splits": vocab_splits(B, vocab, num_sms(0)),
                     "single_pass_ms": one, "split_ms": auto, "bytes_floor_ms": floor_ms})
        print("[sampler]", json.dumps(rows[-1]), flush=True)
    return rows


def engine_grid(cfg, state, bw: float, single_pass: bool, async_scheduling: bool = False) -> list[dict]:
    from hybridrl.rollout import triton_decode, triton_sample
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.rollout.sampling_params import SamplingParams

    saved = triton_decode.decode_splits, triton_sample.vocab_splits
    if single_pass:  # the kernels as they were before splitting: one program per (sequence, kv head) / per row
        triton_decode.decode_splits = lambda *a, **k: 1
        triton_sample.vocab_splits = lambda *a, **k: 1
    rows, steps = [], 48
    weight_bytes = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in state.values()}.values())
    try:
        for B, C in ENGINE_GRID:
            config = EngineConfig(dtype=torch.bfloat16, max_model_len=C + steps + 16, max_num_seqs=B,
                                  max_num_batched_tokens=max(8192, C + steps + 16), gpu_memory_utilization=0.6,
                                  async_scheduling=async_scheduling)
            engine = LLMEngine(cfg, config, device="cuda")
            engine.wake_up(("weights",))
            engine.load_weights(state.items())
            engine.wake_up(("kv_cache",))
            g = torch.Generator().manual_seed(B)
            prompts = torch.randint(0, cfg.vocab_size, (B, C), generator=g).tolist()
            params = SamplingParams(n=1, temperature=1.0, max_tokens=steps, ignore_eos=True, seed=0)
            engine.generate(prompts, SamplingParams(n=1, max_tokens=steps, ignore_eos=True, seed=1))  # graphs
            engine.reset_stats()
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            wall = time.perf_counter() - t0
            st = engine.stats
            step_ms = 1e3 * (st["decode_launch_s"] + st["decode_wait_s"]) / st["num_decode_steps"]
            kv_token = engine.runner.block_bytes() / engine.config.block_size
            floor_ms = (weight_bytes + B * (C + steps / 2) * kv_token) / bw * 1e3
            rows.append({"batch": B, "context": C, "decode_ms_per_step": step_ms, "floor_ms": floor_ms,
                         "vs_floor": step_ms / floor_ms, "decode_steps": st["num_decode_steps"], "wall_s": wall,
                         "schedule_ms_per_step": 1e3 * st["schedule_s"] / st["num_decode_steps"]})
            print("[engine]" + (" single_pass" if single_pass else "") + (" async" if async_scheduling else ""),
                  json.dumps(rows[-1]), flush=True)
            engine.sleep()
            del engine
            torch.cuda.empty_cache()
    finally:
        triton_decode.decode_splits, triton_sample.vocab_splits = saved
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="1.5B", choices=sorted(SHAPES))
    ap.add_argument("--engine-only", action="store_true", help="only the engine's split kernels, sync vs async")
    ap.add_argument("--out", default="benchmarks/results/decode_floor.json")
    args = ap.parse_args()
    h, i, layers, heads, kv, tied = shape = SHAPES[args.model]
    cfg = transformers.Qwen2Config(hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv, vocab_size=151936,
                                   max_position_embeddings=32768, tie_word_embeddings=tied, torch_dtype="bfloat16")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
              "model": args.model}
    result["ceilings"] = device_ceilings()
    bw = result["ceilings"]["copy_gb_per_s"] * 1e9
    print("[ceilings]", json.dumps(result["ceilings"]), flush=True)
    if not args.engine_only:
        result["attention"] = attention_grid(shape, bw)
        result["sampler"] = sampler_grid(cfg.vocab_size, bw)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    state = {k: v for k, v in model.state_dict().items()}
    del model
    if not args.engine_only:
        result["engine_single_pass"] = engine_grid(cfg, state, bw, single_pass=True)
    result["engine_split"] = engine_grid(cfg, state, bw, single_pass=False)
    result["engine_split_async"] = engine_grid(cfg, state, bw, single_pass=False, async_scheduling=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
