"""Rollout throughput: native paged-KV engine vs HF generate, random-weight Qwen2.5 shapes.

Workload (DESIGN.md §7): batch 256 samples, 256-token prompts, 256 new tokens, EOS ignored, bf16.
  native_n1        : 256 distinct prompts, n=1
  native_n8_shared : 32 prompts x n=8 with prompt sharing (prompt prefilled once, blocks ref-counted)
  native_n8_unshared: same without sharing
  native_n1_unfused: (--ab-unfused) native_n1 with HYBRIDRL_FUSED=0: the torch decoder ops and sampler
  native_*_async   : (--ab-async) native_n1 and native_n8_shared with async scheduling (step t+1 launched
                     before step t is read)
  hf_generate      : 256 distinct prompts through transformers generate (sdpa), the naive baseline
Per run also the host-clock split: schedule_s (scheduler), *_launch_s (input build + enqueue),
*_wait_s (blocked on the GPU at the one token read a step) and decode_ms_per_step.
Reports generated tok/s, wall time, KV blocks peak (shared vs unshared), KV GiB, CUDA-graph capture
seconds, and writes JSON with device facts to benchmarks/results/rollout.json.

  PYTHONPATH=. python benchmarks/rollout.py [--models 0.5B,1.5B,7B] [--skip-hf] [--hf-models 7B]
      [--ab-unfused 7B] [--ab-async 7B] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import transformers

from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.sampling_params import SamplingParams

SHAPES = {  # Qwen2.5 shapes (hidden, intermediate, layers, heads, kv heads, tied)
    "0.5B": (896, 4864, 24, 14, 2, True),
    "1.5B": (1536, 8960, 28, 12, 2, True),
    "7B": (3584, 18944, 28, 28, 4, False),
}


def qwen_config(name):
    h, i, layers, heads, kv, tied = SHAPES[name]
    return transformers.Qwen2Config(hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=kv, vocab_size=151936,
                                    max_position_embeddings=4096, tie_word_embeddings=tied, torch_dtype="bfloat16")


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def run_native(cfg, state, prompts, n, sharing, args, async_scheduling=False):
    config = EngineConfig(dtype=torch.bfloat16, max_model_len=args.prompt_len + args.new_tokens + 16,
                          max_num_seqs=args.batch, enable_prefix_sharing=sharing,
                          gpu_memory_utilization=args.gpu_memory_utilization, async_scheduling=async_scheduling)
    engine = LLMEngine(cfg, config, device="cuda")
    engine.wake_up(("weights",))
    (_, t_load) = timed(lambda: engine.load_weights(state.items()))
    (_, t_kv) = timed(lambda: engine.wake_up(("kv_cache",)))
    engine.generate(prompts[:2], SamplingParams(n=2, max_tokens=4, ignore_eos=True, seed=0))  # JIT warm-up
    engine.reset_stats()
    params = SamplingParams(n=n, temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True, seed=0)
    outs, secs = timed(lambda: engine.generate(prompts, params))
    gen = sum(len(c.token_ids) for o in outs for c in o.outputs)
    peak_gb = torch.cuda.max_memory_allocated() / 2**30
    st = dict(engine.stats)
    engine.sleep()
    return {"seconds": secs, "generated_tokens": gen, "tok_per_s": gen / secs, "load_weights_s": t_load,
            "wake_kv_s": t_kv, "kv_blocks_peak": st["kv_blocks_peak"],
            "kv_blocks_peak_unshared": st["kv_blocks_peak_unshared"],
            "kv_gib_peak": st["kv_blocks_peak"] * st["kv_block_bytes"] / 2**30,
            "kv_gib_peak_unshared": st["kv_blocks_peak_unshared"] * st["kv_block_bytes"] / 2**30,
            "num_kv_blocks": st["num_kv_blocks"], "cuda_graph_capture_s": st["cuda_graph_capture_s"],
            "num_preemptions": st["num_preemptions"], "prefill_tokens_computed": st["prefill_tokens_computed"],
            "max_memory_allocated_gib": peak_gb, "fused_kernels": os.environ.get("HYBRIDRL_FUSED", "1") != "0",
            # where the wall time went (host clocks; *_wait_s = blocked on the GPU at the step's token read)
            "num_prefill_steps": st["num_prefill_steps"], "num_decode_steps": st["num_decode_steps"],
            "async_scheduling": async_scheduling, "num_lookahead_steps": st["num_lookahead_steps"],
            **{k: st[k] for k in ("schedule_s", "prefill_launch_s", "prefill_wait_s", "decode_launch_s",
                                  "decode_wait_s")},
            "decode_ms_per_step": 1e3 * (st["decode_launch_s"] + st["decode_wait_s"]) / max(1, st["num_decode_steps"])}


def run_hf(model, prompts, args):
    ids = torch.tensor(prompts, device="cuda")
    out, secs = timed(lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                             min_new_tokens=args.new_tokens, do_sample=True, top_k=0,
                                             eos_token_id=None, pad_token_id=0))
    gen = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"seconds": secs, "generated_tokens": gen, "tok_per_s": gen / secs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.5B,1.5B,7B")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--hf-models", default=None, help="sizes to run HF generate on (default: all of --models)")
    ap.add_argument("--ab-unfused", default="", help="sizes to also run native_n1 with HYBRIDRL_FUSED=0 (A/B)")
    ap.add_argument("--ab-async", default="", help="sizes to also run with async scheduling (A/B)")
    ap.add_argument("--out", default="benchmarks/results/rollout.json")
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "command": " ".join(sys.argv),
              "workload": vars(args), "models": {}}
    g = torch.Generator().manual_seed(0)
    for name in args.models.split(","):
        cfg = qwen_config(name)
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                                  dtype=torch.bfloat16).eval()
        state = model.state_dict()
        prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), generator=g).tolist()
        group_prompts = prompts[: args.batch // args.n]
        r = {"native_n1": run_native(cfg, state, prompts, 1, True, args),
             "native_n8_shared": run_native(cfg, state, group_prompts, args.n, True, args),
             "native_n8_unshared": run_native(cfg, state, group_prompts, args.n, False, args)}
        if name in args.ab_unfused.split(","):
            os.environ["HYBRIDRL_FUSED"] = "0"
            try:
                r["native_n1_unfused"] = run_native(cfg, state, prompts, 1, True, args)
            finally:
                os.environ.pop("HYBRIDRL_FUSED")
        if name in args.ab_async.split(","):
            r["native_n1_async"] = run_native(cfg, state, prompts, 1, True, args, async_scheduling=True)
            r["native_n8_shared_async"] = run_native(cfg, state, group_prompts, args.n, True, args,
                                                     async_scheduling=True)
        if not args.skip_hf and (args.hf_models is None or name in args.hf_models.split(",")):
            r["hf_generate"] = run_hf(model, prompts, args)
            r["speedup_vs_hf"] = r["native_n1"]["tok_per_s"] / r["hf_generate"]["tok_per_s"]
        r["kv_saving_from_sharing"] = 1 - r["native_n8_shared"]["kv_blocks_peak"] / max(
            1, r["native_n8_unshared"]["kv_blocks_peak"])
        result["models"][name] = r
        print(name, json.dumps(r, indent=1), flush=True)
        del model, state
        torch.cuda.empty_cache()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
