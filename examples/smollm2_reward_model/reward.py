"""Reward for the reward-model recipe: the reward model's score is the reward; the a + b rule is only reported.

`compute_score(..., rm_score)` returns {"score": rm_score, "acc": rule}: the token-level reward is the reward
model's score at the last response token, exactly as with no custom function, and `acc` is 1.0 when the
response's last integer is the sum (examples/smollm2_arith/reward.py). Validation reports `acc` as
val-core/smollm2_add/acc/mean@1 (the arith recipe's key, so the two runs compare directly) and the reward model's
score as val-aux/smollm2_add/reward/mean@1.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "smollm2_arith_reward", Path(__file__).resolve().parent.parent / "smollm2_arith" / "reward.py")
rule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rule)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, rm_score=None) -> dict:
    if rm_score is None:
        raise ValueError("examples/smollm2_reward_model/reward.py rewards with the reward model's score: set "
                         "reward_model.enable=true")
    return {"score": rm_score, "acc": rule.compute_score(data_source, solution_str, ground_truth)}
