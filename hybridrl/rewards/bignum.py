"""Scorer for the `bignum` task: the last `#### N` must be exactly the integer ground truth.

Stricter than the lenient numeric scorer on purpose: N must be written as an integer (digits, an optional sign,
`,` digit grouping allowed), so `1.2e17` or `123.0` earn nothing; the whole text is searched (a long tool-using
answer keeps its final line at the end anyway). The reward manager scores the model's own tokens only (tool
messages are masked out), so copying the calculator's answer into the final line is the model's job.
"""

from __future__ import annotations

import re

__all__ = ["compute_score"]

_ANSWER = re.compile(r"####\s*([+-]?[\d,]+)(?![\d.eE])")


def compute_score(solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0) -> float:
    found = _ANSWER.findall(solution_str)
    if not found:
        return 0.0
    try:
        return score if int(found[-1].replace(",", "")) == int(str(ground_truth).strip()) else format_score
    except ValueError:
        return format_score
