"""Scorer for the `arith` task: the last `#### N` must equal the integer ground truth.

Same extraction as the lenient numeric scorer (strict `#### N`, or `method='flexible'` for the last number), so a
model trained on one format transfers to the other; values compared exactly as numbers.
"""

from __future__ import annotations

from hybridrl.rewards.lenient_numeric import compute_score as _lenient_score

__all__ = ["compute_score"]


def compute_score(solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    return _lenient_score(solution_str, ground_truth, method=method, format_score=format_score, score=score)
