"""Plots for docs/benchmarks.md from the committed results JSON (no GPU needed):

  python benchmarks/plot_results.py   → docs/img/memory_7b_scheme_a_vs_hybrid.png, docs/img/memory_1.5b_scheme_a_vs_hybrid.png
"""

from __future__ import annotations

import json
from pathlib import Path

from hybridrl.trainer.memory_timeline import MemoryTimeline, plot_comparison

ROOT = Path(__file__).resolve().parent.parent
RESULTS, IMG = ROOT / "benchmarks" / "results", ROOT / "docs" / "img"


def timeline(variant: dict, name: str) -> MemoryTimeline:
    tl = MemoryTimeline(name)
    for step, metrics in enumerate(variant["per_step"], start=1):
        tl.record_from_metrics(step, metrics)
    return tl


def main():
    IMG.mkdir(parents=True, exist_ok=True)
    for size in ("7b", "1.5b"):
        data = json.loads((RESULTS / f"grpo_qwen2.5-{size}.json").read_text())["variants"]
        out = IMG / f"memory_{size}_scheme_a_vs_hybrid.png"
        plot_comparison(timeline(data["scheme_a"], "scheme A (resident engine)"),
                        timeline(data["hybrid"], "hybrid engine"), out,
                        title=f"Qwen2.5-{size.upper()} GRPO on 2×H200, 64 prompts × n=8: peak allocated GB per phase")
        print(out)


if __name__ == "__main__":
    main()
