"""Countdown scorer (TinyZero's task): the equation in the last <answer>...</answer> must use every given
number exactly once and evaluate to the target.

- Parsing and evaluation go through `hybridrl.rewards.expression` (exact fractions, no Python `eval`).
- An answer of the form `expr = value` is judged on `expr`.
- Scores as in TinyZero: `score` when right, `format_score` (0.1) when an equation was given but is wrong
  (bad numbers, wrong value, unparsable), 0 when there is no <answer> tag.
- ground_truth: TinyZero's dict {"target", "numbers"} or its JSON string (what our generator writes).
"""

from __future__ import annotations

import json
import re

from hybridrl.rewards.expression import ExpressionError, evaluate, numbers_in

__all__ = ["compute_score", "extract_equation", "parse_ground_truth"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_equation(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str)
    if not found:
        return None
    return found[-1].split("=")[0].strip()


def parse_ground_truth(ground_truth) -> tuple[int, list[int]]:
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as e:
            raise ValueError(f"countdown ground_truth must be JSON {{'target', 'numbers'}}, got {ground_truth!r}") from e
    if not isinstance(ground_truth, dict) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(f"countdown ground_truth needs keys 'target' and 'numbers', got {ground_truth!r}")
    return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.1,
                  score: float = 1.0) -> float:
    target, numbers = parse_ground_truth(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return 0.0
    try:
        if sorted(numbers_in(equation)) != sorted(numbers):
            return format_score
        value = evaluate(equation)
    except ExpressionError:
        return format_score
    return score if value == target else format_score
