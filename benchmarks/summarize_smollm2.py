"""Summarize `hybridrl bench run smollm2-vs-trl` output: the validation curves of hybridrl and TRL's GRPOTrainer on the
real-model task by step and by training wall time (validation excluded on both sides), the wall time each needed
to first reach accuracy levels both reached, step times and peak memory. Writes OUT/summary.json and
OUT/smollm2_vs_trl.png.

  python benchmarks/summarize_smollm2.py benchmarks/results/smollm2_vs_trl

Inputs in OUT: hybridrl_metrics.jsonl (verl metrics per step); TRL's curve from trl.json (`val_curve`) or, for a
run cut short by the device's time limit, the `[trl] step N val acc A train wall W s` lines of trl_curve.log;
TRL's step time and peak from trl_mem.json when present (a short run without validation), else from the curve run.
Optional: trl_curve_run1.log (an earlier, shorter TRL curve run, plotted) and hybridrl_lora_metrics.jsonl (the
same task with LoRA, plotted and summarized). A level hybridrl reached and TRL's run did not is reported as an
upper bound of the wall-time ratio (hybridrl's time over TRL's last validated wall time).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

_TRL_VAL = re.compile(r"^\[trl\] step (\d+) val acc ([0-9.]+) train wall ([0-9.]+)s", re.M)


def hybridrl_side(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    wall, curve, steps, peaks = 0.0, [], [], []
    for row in rows:
        d = row["data"]
        if "timing_s/step" in d:  # validation time is timing_s/testing, not part of timing_s/step
            wall += d["timing_s/step"]
            steps.append(d["timing_s/step"])
            peaks.append(d.get("perf/max_memory_allocated_gb", 0.0))
        acc = [v for k, v in d.items() if k.startswith("val-core/") and "/acc/" in k]
        if acc:
            curve.append({"step": row["step"], "train_wall_s": wall, "acc": acc[0]})
    return {"curve": curve, "step_s": steps, "median_step_s": statistics.median(steps[1:]),
            "first_step_s": steps[0], "peak_allocated_gib": max(peaks)}


def trl_side(out: Path) -> dict:
    curve_json = out / "trl.json"
    if curve_json.is_file():
        data = json.loads(curve_json.read_text())
        curve = data["val_curve"]
        step_s, peak = data["step_s"], data["peak_allocated_gb"]
    else:
        curve = trl_log_curve(out / "trl_curve.log")
        last = curve[-1]
        step_s, peak = [last["train_wall_s"] / last["step"]], None  # the cut-short run has no per-step times
    result = {"curve": curve, "median_step_s": statistics.median(step_s), "peak_allocated_gib": peak}
    mem = out / "trl_mem.json"
    if mem.is_file():
        m = json.loads(mem.read_text())
        result.update(mem_run_median_step_s=m["median_step_s"], mem_run_step_s=m["step_s"],
                      peak_allocated_gib=m["peak_allocated_gb"])
    return result


def trl_log_curve(path: Path) -> list[dict]:
    return [{"step": int(s), "train_wall_s": float(w), "acc": float(a)} for s, a, w in _TRL_VAL.findall(path.read_text())]


def first_reach(curve: list[dict], level: float) -> dict | None:
    return next((p for p in curve if p["acc"] >= level), None)


def main(out: str) -> dict:
    out = Path(out)
    ours, trl = hybridrl_side(out / "hybridrl_metrics.jsonl"), trl_side(out)
    levels = {}
    for level in (0.2, 0.4, 0.585, 0.75):
        a, b = first_reach(ours["curve"], level), first_reach(trl["curve"], level)
        if a and b:
            levels[str(level)] = {"hybridrl_step": a["step"], "hybridrl_wall_s": a["train_wall_s"],
                                  "trl_step": b["step"], "trl_wall_s": b["train_wall_s"],
                                  "wall_ratio": a["train_wall_s"] / b["train_wall_s"]}
        elif a:  # TRL's run ended below the level: its time to reach it is more than its last validated wall
            last = trl["curve"][-1]
            levels[str(level)] = {"hybridrl_step": a["step"], "hybridrl_wall_s": a["train_wall_s"],
                                  "trl_not_reached_by_step": last["step"], "trl_acc_then": last["acc"],
                                  "trl_wall_s_more_than": last["train_wall_s"],
                                  "wall_ratio_below": a["train_wall_s"] / last["train_wall_s"]}
    extra = {}
    run1 = out / "trl_curve_run1.log"
    if run1.is_file():
        extra["trl_run1_curve"] = trl_log_curve(run1)
    lora_path = out / "hybridrl_lora_metrics.jsonl"
    if lora_path.is_file():
        extra["hybridrl_lora"] = hybridrl_side(lora_path)
    summary = {"hybridrl": ours, "trl": trl, **extra, "reach": levels,
               "step_time_ratio": ours["median_step_s"] / trl.get("mem_run_median_step_s", trl["median_step_s"]),
               "peak_ratio": (ours["peak_allocated_gib"] / trl["peak_allocated_gib"]
                              if trl["peak_allocated_gib"] else None)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    curves = [(ours["curve"], "hybridrl"), (trl["curve"], "TRL GRPOTrainer")]
    if "trl_run1_curve" in extra:
        curves.append((extra["trl_run1_curve"], "TRL GRPOTrainer (run 1)"))
    if "hybridrl_lora" in extra:
        curves.append((extra["hybridrl_lora"]["curve"], "hybridrl LoRA r32, lr 1e-4"))
    plot(out / "smollm2_vs_trl.png", curves)
    return summary


def two_panels():
    """A figure with two side-by-side axes (matplotlib without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 2, figsize=(10, 3.8))


def finish(fig, axes, ylabels: tuple[str, str], xlabels: tuple[str, str], title: str, path: Path) -> None:
    for ax, xl, yl in zip(axes, xlabels, ylabels):
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(path: Path, curves: list[tuple[list[dict], str]]) -> None:
    fig, axes = two_panels()
    for curve, name in curves:
        axes[0].plot([p["step"] for p in curve], [p["acc"] for p in curve], marker="o", label=name)
        axes[1].plot([p["train_wall_s"] / 60 for p in curve], [p["acc"] for p in curve], marker="o", label=name)
    acc = "sampled validation accuracy (T=0.8)"
    finish(fig, axes, (acc, acc), ("GRPO step", "training wall time (min, validation excluded)"),
           "SmolLM2-135M-Instruct, a + b (64 prompts x 8), one H200", path)

if __name__ == "__main__":
    print(json.dumps({k: v for k, v in main(sys.argv[1]).items()
                      if k not in ("hybridrl", "trl", "trl_run1_curve", "hybridrl_lora")}, indent=2))
