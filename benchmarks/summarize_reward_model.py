"""Summarize the reward-model-driven SmolLM2 run (`hybridrl bench run smollm2-reward-model`): the reward
model's held-out quality (rm_eval.json), the rule accuracy on validation (val-core acc: what the reward model was
trained to predict, never seen by GRPO) next to the reward model's own mean score, per step, and the same task's
rule-rewarded curve for comparison. Writes summary.json and reward_model_run.png into OUT.

  python benchmarks/summarize_reward_model.py benchmarks/results/smollm2_reward_model \
      [benchmarks/results/smollm2_vs_trl/hybridrl_metrics.jsonl]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from summarize_smollm2 import finish, hybridrl_side, two_panels  # noqa: E402


def reward_model_side(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [{"step": r["step"], "rm_score": r["data"]["reward_model/score/mean"],
              "entropy": r["data"].get("actor/entropy")} for r in rows if "reward_model/score/mean" in r["data"]]
    val = [{"step": r["step"], "rm_score": r["data"][k]} for r in rows for k in r["data"]
           if k.startswith("val-aux/") and k.endswith("/reward/mean@1")]
    return {"train": train, "val_rm_score": val, **hybridrl_side(path)}


def main(out: str, rule_metrics: str | None = None) -> dict:
    root = Path(out)
    rm = json.loads((root / "rm_eval.json").read_text())
    run = reward_model_side(root / "smollm2_rm_metrics.jsonl")
    summary = {"reward_model": {k: rm[k] for k in ("heldout", "heldout_policy_samples", "policy_rule_accuracy",
                                                   "train_examples", "sample_s", "train_s")},
               "rm_driven": {"val_acc": run["curve"], "val_rm_score": run["val_rm_score"],
                             "median_step_s": run["median_step_s"], "peak_allocated_gib": run["peak_allocated_gib"]}}
    rule = hybridrl_side(Path(rule_metrics)) if rule_metrics else None
    if rule:
        summary["rule_driven_val_acc"] = rule["curve"]
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    _plot(root / "reward_model_run.png", run, rule)
    return summary


def _plot(path: Path, run: dict, rule: dict | None) -> None:
    fig, axes = two_panels()
    acc = run["curve"]
    axes[0].plot([p["step"] for p in acc], [p["acc"] for p in acc], marker="o", label="rewarded by the reward model")
    if rule:
        axes[0].plot([p["step"] for p in rule["curve"]], [p["acc"] for p in rule["curve"]], marker="o",
                     label="rewarded by the rule")
    axes[1].plot([p["step"] for p in run["train"]], [p["rm_score"] for p in run["train"]], label="train (mean)")
    axes[1].plot([p["step"] for p in run["val_rm_score"]], [p["rm_score"] for p in run["val_rm_score"]],
                 marker="o", label="validation (mean)")
    finish(fig, axes, ("validation accuracy by the rule (T=0.8)", "reward model score"), ("GRPO step", "GRPO step"),
           "SmolLM2-135M-Instruct, a + b, GRPO on a learned reward model (one H200)", path)

if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:3]), indent=1)[:3000])
