"""Plots for docs/benchmarks.md from the committed results JSON (no GPU needed):

  python benchmarks/plot_results.py   → docs/img/memory_{7b,1.5b,llama3-8b}_scheme_a_vs_hybrid.png,
                                        docs/img/stability_7b_util07.png (from the stability run's console log)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hybridrl.trainer.memory_timeline import MemoryTimeline, plot_comparison

ROOT = Path(__file__).resolve().parent.parent
RESULTS, IMG = ROOT / "benchmarks" / "results", ROOT / "docs" / "img"


def timeline(variant: dict, name: str) -> MemoryTimeline:
    tl = MemoryTimeline(name)
    for step, metrics in enumerate(variant["per_step"], start=1):
        tl.record_from_metrics(step, metrics)
    return tl


def console_steps(log: Path) -> list[dict]:
    """The trainer's console lines `step N | key value | ...` as dicts (numbers only)."""
    rows = []
    for line in log.read_text().splitlines():
        if re.match(r"step \d+ \|", line):
            fields = [f.strip().rsplit(" ", 1) for f in line.split("|")]
            rows.append({k: float(v) for k, v in fields})
    return rows


def plot_stability(log: Path, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = console_steps(log)
    steps = [r["step"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(steps, [r["mem_gb"] for r in rows], marker="o")
    ax1.set(xlabel="step", ylabel="peak allocated GB (busiest rank)", title="memory")
    ax1.set_ylim(0, 140)
    ax2.plot(steps, [r["step_s"] for r in rows], marker="o", label="step")
    ax2.plot(steps, [r["gen_s"] for r in rows], marker="o", label="rollout (gen)")
    ax2.plot(steps, [r["upd_s"] for r in rows], marker="o", label="update_actor")
    ax2.set(xlabel="step", ylabel="seconds", title="time")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    IMG.mkdir(parents=True, exist_ok=True)
    for name, file in (("7b", "grpo_qwen2.5-7b"), ("1.5b", "grpo_qwen2.5-1.5b"), ("llama3-8b", "grpo_llama3-8b")):
        data = json.loads((RESULTS / f"{file}.json").read_text())["variants"]
        out = IMG / f"memory_{name}_scheme_a_vs_hybrid.png"
        model = "Llama-3-8B shape" if name.startswith("llama") else f"Qwen2.5-{name.upper()}"
        plot_comparison(timeline(data["scheme_a"], "scheme A (resident engine)"),
                        timeline(data["hybrid"], "hybrid engine"), out,
                        title=f"{model} GRPO on 2×H200, 64 prompts × n=8: peak allocated GB per phase")
        print(out)
    out = IMG / "stability_7b_util07.png"
    plot_stability(RESULTS / "grpo_qwen2.5-7b_stability.log", out,
                   "Qwen2.5-7B hybrid engine, 2×H200, 16 prompts × n=8, gpu_memory_utilization=0.7")
    print(out)


if __name__ == "__main__":
    main()
