"""Summarize the one-H200 Qwen2.5-7B runs of docs/benchmarks.md §0d: per configuration (LoRA r64, full fine-tuning)
hybridrl's step time over runs (each run's mean over its timed steps) in a results folder and in the folder of the
measurements before it, TRL's over its timed steps in both, their medians and spreads, the ratios and peaks; a
full fine-tuning run with bf16 masters (`..._full_bf16*.json`) where the folder has them. TRL's files are
`trl_qwen2.5-7b_{lora0,lora64}*.json` (lora0 = full fine-tuning; one file or one per run). Writes summary.json and a
two-panel bar plot (step time, peak memory) into the results folder.

  python benchmarks/summarize_7b.py NOW BEFORE
  NOW BEFORE = benchmarks/results/bf16_one_rank benchmarks/results/prefix_grouper (bf16 masters reduced at one rank,
               three TRL runs in the same session), or
               benchmarks/results/prefix_grouper benchmarks/results/lora_fused (shared-prompt forwards), or
               benchmarks/results/lora_fused benchmarks/results/qwen2.5-7b_defaults (fused LoRA, Liger, recompute)
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
        old, old_peak = hybridrl_runs(before, f"hybridrl_qwen2.5-7b_{kind}_run*.json", kind)
        if not old:   # qwen2.5-7b_defaults: recompute on every layer, peft's LoRA forward and HF's kernels
            old, old_peak = hybridrl_runs(before, "hybridrl_qwen2.5-7b_1gpu.json", kind)
            if kind == "lora":   # the recompute A/B's checkpointed row (its other row is the dropped no-recompute rule)
                ab = json.loads((before / "hybridrl_qwen2.5-7b_lora_recompute_ab.json").read_text())["variants"]
                old += [v["step_s"] for n, v in ab.items() if n.startswith("lora64_ckpt")]
            else:
                more, more_peak = hybridrl_runs(now, "before_liger_hybridrl_qwen2.5-7b_full.json", kind)
                old, old_peak = old + more, max(old_peak, more_peak)
        same_call = sorted(now.glob(f"trl_qwen2.5-7b_{trl_name}*.json"))   # one file, or one per run (_runN)
        earlier = sorted(before.glob(f"trl_qwen2.5-7b_{trl_name}*.json"))
        trl_all, trl_peak = trl_steps(same_call + earlier)
        trl_now, _ = trl_steps(same_call)   # empty where NOW has no TRL run of this kind (then no same-session ratio)
        summary[kind] = {
            "hybridrl_s": _stats(new), "hybridrl_peak_gb": new_peak, "before_s": _stats(old), "before_peak_gb": old_peak,
            "trl_same_call_s": _stats(trl_now) if trl_now else None, "trl_all_steps_s": _stats(trl_all),
            "trl_peak_gb": trl_peak,
            "ratio_same_call": statistics.median(new) / statistics.median(trl_now) if trl_now else None,
            "ratio_trl_median": statistics.median(new) / statistics.median(trl_all),
            "peak_ratio": new_peak / trl_peak}
    bf16, bf16_peak = hybridrl_runs(now, "hybridrl_qwen2.5-7b_full_bf16*.json", "full")
    if bf16:
        full = summary["full"]
        summary["full_bf16_masters"] = {
            "hybridrl_s": _stats(bf16), "hybridrl_peak_gb": bf16_peak,
            "ratio_same_call": statistics.median(bf16) / full["trl_same_call_s"]["median"]
            if full["trl_same_call_s"] else None,
            "ratio_trl_median": statistics.median(bf16) / full["trl_all_steps_s"]["median"],
            "peak_ratio": bf16_peak / full["trl_peak_gb"]}
    (now / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, now / "qwen2.5-7b_1gpu.png")
    return summary


def plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 3.8))
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
    bf16 = summary.get("full_bf16_masters")
    if bf16:   # one more group: bf16 masters (TRL's precision) next to TRL's full fine-tuning
        labels = [*labels, "full, bf16 masters"]
        for off, (s_key, m_key, color, src) in ((0, ("hybridrl_s", "hybridrl_peak_gb", "#3182bd", bf16)),
                                                (0.27, ("trl_all_steps_s", "trl_peak_gb", "#fd8d3c", summary["full"]))):
            ax_t.bar([2 + off], [src[s_key]["median"]], 0.27, color=color,
                     yerr=[[src[s_key]["median"] - src[s_key]["min"]], [src[s_key]["max"] - src[s_key]["median"]]],
                     capsize=3)
            ax_m.bar([2 + off], [src[m_key]], 0.27, color=color)
    for ax, title in ((ax_t, "s per GRPO step (median, min-max)"), (ax_m, "peak allocated GiB")):
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title)
    ax_t.legend(fontsize=8)
    fig.suptitle("Qwen2.5-7B shape, one H200, 64 prompts x 8, 256 + 256 tokens (hybridrl: fp32 masters / fp32 adapters"
                 + (" unless marked" if bf16 else "") + ")", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2])), indent=1))
