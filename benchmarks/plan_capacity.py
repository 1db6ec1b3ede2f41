"""How much of a GRPO step fits one GPU, hybrid engine vs scheme A, as the run plan sizes it: a prediction of the
memory model (plan/memory.py), not a measurement. The same model's predictions were within +0.6% to +4% of the
measured per-phase peaks on an H200 at these shapes (docs/benchmarks.md 0, 0d and 1).

The batch size itself does not bound memory: the update runs in micro-batches, and when the step's KV does not fit
at full length, the plan runs fewer sequences at once with `ignore_eos` (the rest wait their turn) or all of them,
preempting by recompute if the cache runs out, where responses end at EOS. The plans here set `ignore_eos`, so
"sequences at once" is how many can reach the response limit together: the worst case. What the scheme changes is
that number — the rollout's throughput when responses run long — and the longest response that fits at all. For each model
preset, response length and scheme (64 prompts x 8 by default, the defaults otherwise: gradient checkpointing, fp32
masters, prompt sharing): the sequences at once (0 = the plan refuses), and the longest response (multiples of 256
tokens, found by bisection), with the predicted peak and the parameters the hybrid engine borrows from the actor
instead of copying (plan.rollout.borrowed_params). `--set KEY=VALUE` (repeatable) adds config keys to every plan,
e.g. LoRA or bf16 masters.

  python benchmarks/plan_capacity.py --out benchmarks/results/plan_capacity.json
  python benchmarks/plan_capacity.py --presets qwen3-30b-a3b --set actor_rollout_ref.model.lora_rank=32 --out OUT.json
"""

from __future__ import annotations

import argparse
import json

from hybridrl.assets.tiny_model import SIZE_PRESETS, make_config
from hybridrl.config import ConfigError, load_config
from hybridrl.plan import DeviceSpec, make_plan
from hybridrl.plan.memory import GiB

SCHEMES = (("hybrid", True), ("scheme_a", False))


def plan_or_none(hf, prompts: int, n: int, prompt_len: int, response_len: int, hybrid: bool, device, extra=()):
    keys = [*extra, f"data.train_batch_size={prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            f"actor_rollout_ref.rollout.n={n}", f"data.max_prompt_length={prompt_len}",
            f"data.max_response_length={response_len}", "trainer.n_gpus_per_node=1",
            f"actor_rollout_ref.hybrid_engine={str(hybrid).lower()}", "actor_rollout_ref.rollout.ignore_eos=true"]
    try:
        return make_plan(load_config(overrides=keys), hf, device)
    except ConfigError:
        return None


def longest_response(hf, prompts, n, prompt_len, hybrid, device, extra=(), step: int = 256) -> int:
    """Longest response (a multiple of `step`, within the model's positions) the plan accepts; 0 if none."""
    lo, hi = 0, (hf.max_position_embeddings - prompt_len) // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan_or_none(hf, prompts, n, prompt_len, mid * step, hybrid, device, extra) is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b")
    p.add_argument("--response-lens", default="1024,4096,16384")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gpu-memory-gb", type=float, default=139.8, help="GiB per GPU (H200: 139.8)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config key for every plan")
    p.add_argument("--out")
    a = p.parse_args()
    device = DeviceSpec("cuda", f"{a.gpu_memory_gb} GiB GPU", int(a.gpu_memory_gb * GiB))
    rows = []
    for preset in a.presets.split(","):
        spec = dict(SIZE_PRESETS[preset])
        hf = make_config(spec.pop("arch"), **spec)
        row = {"preset": preset, "prompts": a.prompts, "n": a.n, "prompt_len": a.prompt_len}
        for scheme, hybrid in SCHEMES:
            row[f"{scheme}_longest_response"] = longest_response(hf, a.prompts, a.n, a.prompt_len, hybrid, device,
                                                                 a.set)
            for r in (int(x) for x in a.response_lens.split(",")):
                plan = plan_or_none(hf, a.prompts, a.n, a.prompt_len, r, hybrid, device, a.set)
                row[f"{scheme}_seqs_at_once_r{r}"] = plan.rollout.kv_cache.max_num_seqs if plan else 0
                if plan:
                    row[f"{scheme}_peak_gib_r{r}"] = round(max(pm.total for pm in plan.predicted.values()) / GiB, 2)
                    row[f"{scheme}_gen_gib_r{r}"] = round(plan.predicted["gen"].total / GiB, 2)
                    row[f"{scheme}_borrowed_params_r{r}"] = plan.rollout.borrowed_params
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"what": "predicted by the run plan's memory model (not measured)", "device": str(device),
              "command": "python benchmarks/plan_capacity.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if k not in ("out", "set"))
              + "".join(f" --set {kv}" for kv in a.set),
              "defaults": "gradient checkpointing, fp32 masters, prompt sharing, one GPU, ignore_eos (every response at "
                          "the limit: the sequences that can reach it together)", "set": a.set, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
