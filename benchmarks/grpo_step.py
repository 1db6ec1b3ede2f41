"""GRPO step benchmark: the whole trainer (Ray workers, FSDP2, resharding, native engine) run side by side in one
process for several variants of one workload, e.g. the hybrid engine vs scheme A (`hybrid_engine=false`).

Workload: random-weight model of a real shape (hybridrl/assets size presets), prompts of exactly --prompt-len
tokens, --response-len new tokens each (EOS ignored, so every step generates the same number of tokens; with
--keep-eos responses end at EOS: benchmarks/long_tail.py makes a model whose lengths are long-tailed), a rule
reward (always 0 on random text: the update still runs the full forward/backward). Per step it records verl's
metrics; the summary reports the mean over steps after the first (warm-up: CUDA-graph capture, allocator growth),
per-phase peak memory (max over steps and ranks) and generated tokens/s.

  python benchmarks/grpo_step.py --preset qwen2.5-1.5b --gpus 2 --variants hybrid,scheme_a --out results.json
  (a variant is NAME or NAME:key=value,key=value over the base config; predefined: hybrid, scheme_a)

A variant that fails (e.g. CUDA out of memory) is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import traceback
from pathlib import Path

PREDEFINED = {"hybrid": ["actor_rollout_ref.hybrid_engine=true"],
              "scheme_a": ["actor_rollout_ref.hybrid_engine=false"]}


def make_prompts(out_dir: Path, tokenizer_dir: Path, n_rows: int, prompt_len: int, seed: int = 0) -> Path:
    """Parquet in verl's schema whose chat-rendered prompts are at least prompt_len tokens (left-truncated to it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(seed)
    words = ["apple", "seven", "river", "count", "sum", "blue", "plus", "nine", "table", "light", "four", "stone"]
    rows = []
    for i in range(n_rows):
        text = "Compute the total. " + " ".join(rng.choice(words) for _ in range(prompt_len))
        assert len(tok(text).input_ids) >= prompt_len
        rows.append({"data_source": "arith", "prompt": [{"role": "user", "content": text}], "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": "0"}, "extra_info": {"split": "train", "index": i}})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"prompts_{n_rows}x{prompt_len}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def base_overrides(a, model_dir: Path, data: Path, run_dir: Path) -> list[str]:
    """The workload's keys; with --defaults none of the tuning keys (micro-batches, KV utilization, engine
    concurrency and prefill budget) is set, so the run plan chooses them as it does for a user."""
    tuning = [] if a.defaults else [
        f"actor_rollout_ref.rollout.gpu_memory_utilization={a.gpu_mem}",
        f"actor_rollout_ref.rollout.max_num_seqs={a.prompts * a.n}",
        f"actor_rollout_ref.rollout.max_num_batched_tokens={max(8192, a.prompt_len + a.response_len)}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={a.logprob_micro}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={a.micro}"]
    return [
        f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data}", "data.val_files=null",
        f"data.max_prompt_length={a.prompt_len}", f"data.max_response_length={a.response_len}",
        "data.filter_overlong_prompts=false", "data.truncation=left", f"data.train_batch_size={a.prompts}",
        "data.shuffle=false",
        f"actor_rollout_ref.rollout.n={a.n}", f"actor_rollout_ref.rollout.tensor_model_parallel_size={a.tp}",
        *([] if a.keep_eos else ["actor_rollout_ref.rollout.ignore_eos=true"]), *tuning,
        f"actor_rollout_ref.actor.ppo_mini_batch_size={a.mini_batch or a.prompts}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={a.grad_ckpt or ('auto' if a.defaults else 'false')}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"trainer.n_gpus_per_node={a.gpus}", "trainer.nnodes=1", f"trainer.device={a.device}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        f"trainer.total_training_steps={a.steps}", "trainer.logger=[console,file]", "trainer.balance_batch=false",
        f"trainer.default_local_dir={run_dir}",
    ]


def summarize(history: list[dict], n_rows: int) -> dict:
    steps = [h for h in history if "timing_s/step" in h]
    timed = steps[1:] if len(steps) > 1 else steps

    def mean(key):
        vals = [h[key] for h in timed if key in h]
        return sum(vals) / len(vals) if vals else None

    gen_tokens = [h["response_length/mean"] * n_rows for h in timed]
    gen_times = [h["timing_s/gen"] for h in timed]
    peaks = {}
    for h in steps:
        for k, v in h.items():
            if k.startswith("memory/") or k.startswith("perf/max_memory"):
                peaks[k] = max(peaks.get(k, 0.0), v)
    keep = ("timing_s/", "memory/", "perf/", "reshard/", "rollout/", "response_length/", "actor/grad_norm",
            "actor/early_update_frac", "plan/", "floor/")
    return {
        "steps_run": len(steps),
        "step_s": mean("timing_s/step"), "gen_s": mean("timing_s/gen"), "reshard_s": mean("timing_s/reshard"),
        "old_log_prob_s": mean("timing_s/old_log_prob"), "update_actor_s": mean("timing_s/update_actor"),
        "update_after_gen_s": mean("timing_s/update_after_gen"), "early_update_frac": mean("actor/early_update_frac"),
        "generated_tok_per_s": sum(gen_tokens) / sum(gen_times) if gen_times else None,
        "reshard_gb_per_rank": mean("reshard/bytes_received_gb"),
        "peak_memory_gb": peaks,
        "per_step": [{k: v for k, v in h.items() if k.startswith(keep)} for h in steps],
    }


def device_facts() -> dict:
    import torch

    facts = {"torch": torch.__version__, "python": platform.python_version(), "host_cpus": os.cpu_count()}
    if torch.cuda.is_available():
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                     gpu_total_gb=torch.cuda.get_device_properties(0).total_memory / 1024**3)
    return facts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen2.5-1.5b", help="hybridrl size preset, or 'dir:PATH' for an existing model")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--logprob-micro", type=int, default=16)
    p.add_argument("--mini-batch", type=int, default=0, help="prompts per mini-batch (0 = the whole batch)")
    p.add_argument("--grad-ckpt", nargs="?", const="true", choices=["true", "false", "auto"], default=None,
                   help="enable_gradient_checkpointing (bare flag: true; unset: auto with --defaults, else false)")
    p.add_argument("--gpu-mem", type=float, default=0.5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--keep-eos", action="store_true", help="responses end at EOS (variable lengths; default: EOS "
                   "ignored, every response --response-len tokens)")
    p.add_argument("--defaults", action="store_true", help="leave micro-batches, KV and engine sizes to the run plan")
    p.add_argument("--repeat", type=int, default=1, help="runs of each variant (reported as NAME#i)")
    p.add_argument("--variants", default="hybrid,scheme_a")
    p.add_argument("--workdir", default="/tmp/hybridrl_bench")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    from hybridrl.config.loader import load_config
    from hybridrl.trainer.launch import run_ppo

    work = Path(a.workdir)
    t0 = time.time()
    if a.preset.startswith("dir:"):
        model_dir = Path(a.preset[4:])
    else:
        from hybridrl.assets.tiny_model import write_size_preset

        model_dir = work / "models" / a.preset
        if not (model_dir / "config.json").exists() or not any(model_dir.glob("*.safetensors")):
            write_size_preset(model_dir, a.preset, weights=True)
    prep_s = time.time() - t0
    data = make_prompts(work / "data", model_dir, a.prompts * 4, a.prompt_len)
    result = {"benchmark": "grpo_step", "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
              "device": device_facts(), "preset": a.preset, "model_prep_s": prep_s,
              "workload": {k: v for k, v in vars(a).items() if k not in ("out", "workdir")}, "variants": {}}
    out = Path(a.out)
    for spec in [v for v in a.variants.split(",") for _ in range(a.repeat)]:
        name, _, extra = spec.partition(":")
        spec = f"{spec}#{sum(k.rsplit('#', 1)[0] == spec for k in result['variants']) + 1}"
        overrides = base_overrides(a, model_dir, data, work / "runs" / str(len(result["variants"])))
        overrides += PREDEFINED.get(name, []) + [e for e in extra.split(";") if e]
        t1 = time.time()
        try:
            summary = run_ppo(load_config(overrides=overrides))
            entry = summarize(summary["history"], a.prompts * a.n)
            entry["init"] = summary.get("init")
        except Exception as e:  # an OOM in one variant is a result, not the end of the benchmark
            entry = {"error": f"{type(e).__name__}: {str(e)[-2000:]}", "traceback": traceback.format_exc()[-4000:]}
            try:
                import ray

                ray.shutdown()
            except Exception:
                pass
        entry["overrides"] = overrides[-3:] if extra else PREDEFINED.get(name, [])
        entry["wall_s"] = time.time() - t1
        result["variants"][spec] = entry
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))  # after each variant: partial results survive
        print(f"[bench] {spec}: step {entry.get('step_s')} s, gen {entry.get('generated_tok_per_s')} tok/s, "
              f"peak {entry.get('peak_memory_gb', {}).get('perf/max_memory_allocated_gb')} GB, "
              f"error {entry.get('error', '')[:200]}", flush=True)
    return result


if __name__ == "__main__":
    main()
