"""Lenient numeric scorer (data source `hybridrl/lenient_numeric`; also behind `arith`), with the interface of
verl's GSM8K scorer: `compute_score(solution_str, ground_truth, method='strict', format_score=0.0, score=1.0)`.
verl's exact GSM8K verdict is `hybridrl.rewards.verl_compat.gsm8k` (data source `openai/gsm8k`).

- strict: the last `#### N` in the text is the answer (a model that writes two answers is judged on its last,
  as in verl); no `#### N` gives 0.
- flexible: the last number anywhere in the text.
- Like verl, only the last 300 characters are searched (a long ramble cannot make the regex expensive).
- Lenient where verl is not: `####42` and `#### $42` are found, and answers are compared as numbers after
  removing `,` and `$` ("1,000" == "1000", "18.0" == "18", "007" == "7"), where verl compares strings;
  a found-but-wrong answer earns `format_score`.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["compute_score", "extract_solution", "numbers_equal"]

SOLUTION_CLIP_CHARS = 300
_STRICT = re.compile(r"#### ?(\-?[0-9\.\,\$]+)")
_ANY_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def _clean(text: str) -> str:
    return text.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    if method not in ("strict", "flexible"):
        raise ValueError(f"lenient_numeric.extract_solution: method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        found = [_clean(s) for s in _STRICT.findall(text)]
    else:
        found = [_clean(s) for s in _ANY_NUMBER.findall(text)]
    found = [s for s in found if s not in ("", "-")]
    return found[-1] if found else None


def numbers_equal(a: str, b: str) -> bool:
    try:
        return Decimal(_clean(a)) == Decimal(_clean(b))
    except InvalidOperation:
        return a.strip() == b.strip()


def compute_score(solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if numbers_equal(answer, str(ground_truth)) else format_score
