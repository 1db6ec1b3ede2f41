"""`default_compute_score`: pick the rule scorer from a sample's data_source (verl's names).

Unknown data sources are an error naming the source and the known ones — a silent 0 would train on noise.
"""

from __future__ import annotations

from hybridrl.rewards import arith, countdown, gsm8k, math

__all__ = ["SCORERS", "default_compute_score"]

SCORERS = {
    "openai/gsm8k": gsm8k.compute_score,
    "lighteval/MATH": math.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math.compute_score,
    "HuggingFaceH4/MATH-500": math.compute_score,
    "countdown": countdown.compute_score,
    "arith": arith.compute_score,
}


def default_compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None):
    scorer = SCORERS.get(data_source)
    if scorer is None:
        raise ValueError(f"default_compute_score: no rule scorer for data_source={data_source!r}; known: "
                         f"{sorted(SCORERS)}. Set custom_reward_function.path to score other sources.")
    return scorer(solution_str, ground_truth)
