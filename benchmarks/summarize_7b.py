"""Summarize the one-H200 Qwen2.5-7B runs of docs/benchmarks.md §0d: per configuration (LoRA r64, full fine-tuning)
hybridrl's step time over runs (each run's mean over its timed steps) before and after the fused LoRA linear, Liger
and partial recompute, TRL's over its timed steps, their medians and spreads, the ratios and peaks. Writes
summary.json and a two-panel bar plot (step time, peak memory) into the results folder.

  python benchmarks/summarize_7b.py [benchmarks/results/lora_fused] [benchmarks/results/qwen2.5-7b_defaults]
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def hybridrl_runs(folder: Path, pattern: str, kind: str) -> tuple[list[float], float]:
    """(step time per run, max peak allocated GiB) of the grpo_step.py JSONs matching `pattern` whose variant is
    LoRA (kind='lora') or full fine-tuning (kind='full')."""
    steps, peak = [], 0.0
    for path in sorted(glob.glob(str(folder / pattern))):
        for name, v in json.loads(Path(path).read_text())["variants"].items():
            if v.get("error") or (("lora_rank" in name) != (kind == "lora")):
                continue
            steps.append(v["step_s"])
            peak = max(peak, v["peak_memory_gb"]["perf/max_memory_allocated_gb"])
    return steps, peak


def trl_steps(paths: list[Path]) -> tuple[list[float], float]:
    steps, peak = [], 0.0
    for path in paths:
        d = json.loads(path.read_text())
        steps += d["step_s"]
        peak = max(peak, d["peak_allocated_gb"])
    return steps, peak


def main(now: Path, before: Path) -> dict:
    summary = {}
    for kind, trl_name in (("lora", "lora64"), ("full", "lora0")):
        new, new_peak = hybridrl_runs(now, f"hybridrl_qwen2.5-7b_{kind}_run*.json", kind)
        # before: the same defaults with recompute on every layer, peft's LoRA forward and HF's kernels
        old, old_peak = hybridrl_runs(before, "hybridrl_qwen2.5-7b_1gpu.json", kind)
        if kind == "lora":   # the recompute A/B's checkpointed row (its other row is the dropped no-recompute rule)
            ab = json.loads((before / "hybridrl_qwen2.5-7b_lora_recompute_ab.json").read_text())["variants"]
            old += [v["step_s"] for n, v in ab.items() if n.startswith("lora64_ckpt")]
        else:
            more, more_peak = hybridrl_runs(now, "before_liger_hybridrl_qwen2.5-7b_full.json", kind)
            old, old_peak = old + more, max(old_peak, more_peak)
        same_call = sorted(now.glob(f"trl_qwen2.5-7b_{trl_name}.json"))
        earlier = sorted(before.glob(f"trl_qwen2.5-7b_{trl_name}*.json"))
        trl_all, trl_peak = trl_steps(same_call + earlier)
        trl_now, _ = trl_steps(same_call)
        summary[kind] = {
            "hybridrl_s": _stats(new), "hybridrl_peak_gb": new_peak, "before_s": _stats(old), "before_peak_gb": old_peak,
            "trl_same_call_s": _stats(trl_now), "trl_all_steps_s": _stats(trl_all), "trl_peak_gb": trl_peak,
            "ratio_same_call": statistics.median(new) / statistics.median(trl_now),
            "ratio_trl_median": statistics.median(new) / statistics.median(trl_all),
            "peak_ratio": new_peak / trl_peak}
    (now / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, now / "qwen2.5-7b_1gpu.png")
    return summary


def plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = ["LoRA r64", "full fine-tuning"]
    bars = [("hybridrl before", "before_s", "before_peak_gb", "#9ecae1"), ("hybridrl now", "hybridrl_s",
             "hybridrl_peak_gb", "#3182bd"), ("TRL (+ peft), bf16", "trl_all_steps_s", "trl_peak_gb", "#fd8d3c")]
    for i, (name, s_key, m_key, color) in enumerate(bars):
        xs = [j + (i - 1) * 0.27 for j in range(2)]
        med = [summary[k][s_key]["median"] for k in ("lora", "full")]
        err = [[m - summary[k][s_key]["min"] for m, k in zip(med, ("lora", "full"))],
               [summary[k][s_key]["max"] - m for m, k in zip(med, ("lora", "full"))]]
        ax_t.bar(xs, med, 0.27, yerr=err, color=color, label=name, capsize=3)
        ax_m.bar(xs, [summary[k][m_key] for k in ("lora", "full")], 0.27, color=color, label=name)
    for ax, title in ((ax_t, "s per GRPO step (median, min-max)"), (ax_m, "peak allocated GiB")):
        ax.set_xticks(range(2), labels)
        ax.set_title(title)
    ax_t.legend(fontsize=8)
    fig.suptitle("Qwen2.5-7B shape, one H200, 64 prompts x 8, 256 + 256 tokens (hybridrl: fp32 masters / fp32 adapters)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]] or [Path("benchmarks/results/lora_fused"),
                                               Path("benchmarks/results/qwen2.5-7b_defaults")]
    print(json.dumps(main(*args), indent=1))
