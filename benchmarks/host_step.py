"""Host work per decode step: the engine's Python (scheduling, the runner's input staging, appending the samples),
with the model's forward, its LM head and the sampler replaced by stubs that return at once, on the CPU.

On a GPU this work overlaps the device's when the step is long (async scheduling launches step t+1 before reading
step t), but a small model's decode step is shorter than it (SmolLM2-135M: ~0.6 ms of host work a step against less
on the GPU, benchmarks/results/long_tail), so there the host sets the pace. Each case: `rows` sequences decoding
`tokens` tokens (EOS ignored) from 37-token prompts, n = 8, async scheduling on and off; the time of a whole
generate call over its decode steps (the prefill is one step of hundreds), median of `--repeat` calls.

  python benchmarks/host_step.py --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "rollout"))
from rollout_helpers import make_engine, tiny_hf_model  # noqa: E402

from hybridrl.bench_manifest import device_facts  # noqa: E402
from hybridrl.rollout import model_runner  # noqa: E402
from hybridrl.rollout.sampling_params import SamplingParams  # noqa: E402


def stub_sample(logits, *args, **kwargs):
    n = logits.shape[0]
    return torch.zeros(n, dtype=torch.long), torch.zeros(n)


def measure(rows: int, tokens: int, async_scheduling: bool, repeat: int) -> dict:
    model = tiny_hf_model("qwen2")
    engine = make_engine(model, block_size=16, num_kv_blocks=rows * (-(-(37 + tokens) // 16) + 1),
                         max_num_seqs=rows, max_num_batched_tokens=rows * 40, async_scheduling=async_scheduling)
    hidden = model.config.hidden_size
    engine.runner.model.forward = lambda ids, pos, ctx: torch.zeros(ids.shape[0], hidden)
    engine.runner.model.compute_logits = lambda h: torch.zeros(h.shape[0], 8)
    prompts = [list(range(3, 40))] * (rows // 8)
    params = SamplingParams(n=8, temperature=1.0, max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts, params)
    per_step = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        per_step.append((time.perf_counter() - t0) / engine.stats["num_decode_steps"] * 1e3)
    return {"rows": rows, "tokens": tokens, "async_scheduling": async_scheduling,
            "decode_steps": engine.stats["num_decode_steps"], "lookahead_steps": engine.stats["num_lookahead_steps"],
            "host_ms_per_step": statistics.median(per_step), "range": [min(per_step), max(per_step)],
            "host_us_per_row": statistics.median(per_step) * 1e3 / rows}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="64,256,512")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    model_runner.sample = stub_sample   # the runner's sampler: a stub that returns at once
    torch.set_num_threads(1)
    cases = [measure(rows, args.tokens, a, args.repeat) for rows in map(int, args.rows.split(",")) for a in (True, False)]
    for c in cases:
        print(json.dumps(c))
    Path(args.out).write_text(json.dumps({"benchmark": "host_step", "command": " ".join(sys.argv),
                                          "device": device_facts(), "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
