"""Summarize the SmolLM2 tool-use run (`hybridrl bench run smollm2-tools`): per validation point the
accuracy (val-core acc), the fraction of trajectories that call the calculator (val-aux/multi_turn/tool_use_rate),
tool calls per trajectory and malformed calls; per training step the same rates. Writes summary.json and
tool_use_run.png into OUT.

  python benchmarks/summarize_tools.py benchmarks/results/smollm2_tools
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from summarize_smollm2 import finish, hybridrl_side, two_panels  # noqa: E402

VAL = {"tool_use_rate": "val-aux/multi_turn/tool_use_rate", "tool_calls_per_trajectory": "val-aux/tool_call_counts/mean",
       "malformed_calls": "val-aux/multi_turn/malformed_calls", "tool_errors": "val-aux/multi_turn/tool_errors",
       "turns_per_trajectory": "val-aux/num_turns/mean"}
TRAIN = {"score": "critic/score/mean", "tool_use_rate": "multi_turn/tool_use_rate",
         "malformed_calls": "multi_turn/malformed_calls", "masked_tool_tokens": "multi_turn/masked_tokens"}


def tools_side(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    val = [{"step": r["step"], **{k: r["data"][m] for k, m in VAL.items()}} for r in rows if VAL["tool_use_rate"] in r["data"]]
    train = [{"step": r["step"], **{k: r["data"].get(m) for k, m in TRAIN.items()}} for r in rows
             if TRAIN["tool_use_rate"] in r["data"]]
    return {"val_tools": val, "train": train}


def main(out: str) -> dict:
    root = Path(out)
    metrics = root / "smollm2_tools_metrics.jsonl"
    run, tools = hybridrl_side(metrics), tools_side(metrics)
    acc = {p["step"]: p["acc"] for p in run["curve"]}
    summary = {"validation": [{**p, "acc": acc.get(p["step"])} for p in tools["val_tools"]], "train": tools["train"],
               "median_step_s": run["median_step_s"], "peak_allocated_gib": run["peak_allocated_gib"]}
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    fig, axes = two_panels()
    v = summary["validation"]
    axes[0].plot([p["step"] for p in v], [p["acc"] for p in v], marker="o", label="accuracy")
    axes[0].plot([p["step"] for p in v], [p["tool_use_rate"] for p in v], marker="o", label="tool-use rate")
    t = tools["train"]
    axes[1].plot([p["step"] for p in t], [p["score"] for p in t], label="reward (mean)")
    axes[1].plot([p["step"] for p in t], [p["tool_use_rate"] for p in t], label="tool-use rate")
    finish(fig, axes, ("validation (128 prompts, T=0.8)", "training batch (512 trajectories)"),
           ("GRPO step", "GRPO step"), "SmolLM2-135M-Instruct learns to use a calculator: multi-turn GRPO (one H200)",
           root / "tool_use_run.png")
    return summary


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1]), indent=1)[:2500])
