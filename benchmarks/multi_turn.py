"""Multi-turn rollout: continuing on the cached KV vs re-prefilling the history every turn, side by side.

A scripted agent (no tokenizer, no real tools) ends every assistant turn after --turn-len sampled tokens and appends
--inject fixed tokens (a stand-in tool message) after --tool-ms of wall time on a thread, --turns times. A: one
`generate(..., agent=...)` call (pause, tools on threads while other sequences decode, resume on the cached KV).
B: what an engine without continuation does — one `generate` per turn whose prompts are the whole histories so far
(every turn re-prefills everything, and the tools of a turn wait for the slowest sequence). C: single-turn at the
same model-token budget (turns x turn-len sampled tokens in one turn, no tools): what multi-turn costs on top.
Greedy, random-weight
model of a real shape, bf16 (or `--model tiny --device cpu`, fp32, to check the script). Writes JSON with the device, torch version, sizes and the command.

    python benchmarks/multi_turn.py --model 0.5B --prompts 64 --n 4 --out OUT/multi_turn.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.multi_turn import TurnOutcome
from hybridrl.rollout.sampling_params import SamplingParams

SHAPES = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
          "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
          "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)}


MAX_NUM_SEQS = 512


class ScriptedTools:
    def __init__(self, turn_len, turns, inject, tool_s, threads):
        self.turn_len, self.turns, self.inject, self.tool_s = turn_len, turns, inject, tool_s
        self.pool = ThreadPoolExecutor(threads)  # as the ToolAgent: a thread for every sequence that may wait
        self.lock = threading.Lock()

    def ends_turn(self, seq):
        return len(seq) - seq.turn_start >= self.turn_len

    def on_turn_end(self, seq, budget):
        seq.agent_state = (seq.agent_state or 0) + 1
        if seq.agent_state >= self.turns:
            f = Future()
            f.set_result(TurnOutcome(None, "stop"))
            return f
        return self.pool.submit(lambda: (time.sleep(self.tool_s), TurnOutcome(list(self.inject)))[1])

    def trajectory_stats(self, seq):
        return {}


def build(model: str, max_model_len: int, device: str):
    import transformers

    cfg = transformers.Qwen2Config(**SHAPES[model], max_position_embeddings=max_model_len)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    kv = None if device == "cuda" else 4096  # on CUDA gpu_memory_utilization sizes the cache
    config = EngineConfig(dtype=dtype, block_size=16, max_num_seqs=MAX_NUM_SEQS, num_kv_blocks=kv, max_num_batched_tokens=16384,
                          max_model_len=max_model_len, gpu_memory_utilization=0.6, enforce_eager=device != "cuda")
    engine = LLMEngine(cfg, config, device=device)
    engine.wake_up(("weights",))
    engine.load_weights(hf.state_dict().items())
    del hf
    engine.wake_up(("kv_cache",))
    return engine


def run_continuation(engine, prompts, args):
    tools = ScriptedTools(args.turn_len, args.turns, [7] * args.inject, args.tool_ms / 1000, MAX_NUM_SEQS)
    params = SamplingParams(n=args.n, temperature=0, max_tokens=args.turns * (args.turn_len + args.inject),
                            ignore_eos=True)
    engine.reset_stats()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, agent=tools)
    wall = time.perf_counter() - t0
    tools.pool.shutdown()
    return wall, dict(engine.stats), [p + c.token_ids for p, o in zip(prompts, outs) for c in o.outputs]


def run_single_turn(engine, prompts, args):
    """The same prompts, samples and model-token budget (turns x turn_len) in one turn: no tools, nothing injected."""
    engine.reset_stats()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(n=args.n, temperature=0, max_tokens=args.turns * args.turn_len,
                                                   ignore_eos=True))
    wall = time.perf_counter() - t0
    return wall, dict(engine.stats), [p + c.token_ids for p, o in zip(prompts, outs) for c in o.outputs]


def run_reprefill(engine, prompts, args):
    """The step and token counters summed over the turns' generate calls (the engine's are per call); the KV peak
    is the largest."""
    totals = dict.fromkeys(("prefill_tokens_computed", "num_prefill_steps", "num_decode_steps", "kv_blocks_peak"), 0)

    def add(stats):
        for k in totals:
            totals[k] = max(totals[k], stats[k]) if k == "kv_blocks_peak" else totals[k] + stats[k]

    engine.reset_stats()
    t0 = time.perf_counter()
    first = engine.generate(prompts, SamplingParams(n=args.n, temperature=0, max_tokens=args.turn_len, ignore_eos=True))
    add(engine.stats)
    hist = [p + c.token_ids for p, o in zip(prompts, first) for c in o.outputs]
    for _ in range(args.turns - 1):
        time.sleep(args.tool_ms / 1000)  # a turn's tools, all trajectories at once, the batch waits for them
        hist = [h + [7] * args.inject for h in hist]
        engine.reset_stats()
        outs = engine.generate(hist, SamplingParams(temperature=0, max_tokens=args.turn_len, ignore_eos=True))
        add(engine.stats)
        hist = [h + o.outputs[0].token_ids for h, o in zip(hist, outs)]
    wall = time.perf_counter() - t0
    return wall, totals, hist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="0.5B", choices=sorted(SHAPES))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--turn-len", type=int, default=64)
    ap.add_argument("--inject", type=int, default=48)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tool-ms", type=float, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    total = args.prompt_len + args.turns * (args.turn_len + args.inject)
    engine = build(args.model, total + 16, args.device)
    g = torch.Generator().manual_seed(0)
    vocab = SHAPES[args.model]["vocab_size"]
    prompts = torch.randint(10, vocab, (args.prompts, args.prompt_len), generator=g).tolist()
    run_continuation(engine, prompts[:4], args)  # warm-up: graphs captured, kernels compiled
    results = {"continuation": [], "reprefill": [], "single_turn": []}
    for _ in range(args.repeats):
        for name, fn in (("continuation", run_continuation), ("reprefill", run_reprefill),
                         ("single_turn", run_single_turn)):
            wall, stats, seqs = fn(engine, prompts, args)
            results[name].append({"wall_s": wall, "prefill_tokens_computed": stats["prefill_tokens_computed"],
                                  "prefill_steps": stats["num_prefill_steps"], "decode_steps": stats["num_decode_steps"],
                                  "kv_blocks_peak": stats["kv_blocks_peak"]})
            results[name][-1]["tokens"] = sum(len(s) for s in seqs)
            if name != "single_turn":
                results.setdefault(f"{name}_seqs", seqs)
    same = sum(a == b for a, b in zip(results.pop("continuation_seqs"), results.pop("reprefill_seqs")))
    med = {k: sorted(r["wall_s"] for r in v)[len(v) // 2] for k, v in results.items()}
    trajectories = args.prompts * args.n
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    out = {"device": device, "torch": torch.__version__, "model": args.model,
           "args": vars(args), "command": " ".join(sys.argv), "results": results, "median_wall_s": med,
           "speedup_median": med["reprefill"] / med["continuation"], "identical_trajectories": same,
           "trajectories": trajectories,
           "trajectories_per_s_median": {k: trajectories / v for k, v in med.items()},
           "model_tokens_per_s_median": {k: trajectories * args.turns * args.turn_len / v for k, v in med.items()},
           # the share of the multi-turn rollout's time that single-turn at the same model tokens does not spend:
           # tool waits not hidden behind other sequences' decoding, and prefilling the injected tool tokens
           "multi_turn_extra_share": (med["continuation"] - med["single_turn"]) / med["continuation"]}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps({k: out[k] for k in ("median_wall_s", "speedup_median", "identical_trajectories",
                                          "trajectories_per_s_median", "multi_turn_extra_share")}))
    print({k: v[0]["prefill_tokens_computed"] for k, v in results.items()})


if __name__ == "__main__":
    main()
