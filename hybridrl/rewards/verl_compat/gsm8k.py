"""GSM8K, judged exactly as verl's `reward_score.gsm8k` judges it.

- Only the last 300 characters are searched (the answer is at the end; long texts stay cheap).
- strict: the last `#### N` (one space after `####`, N made of digits, `-`, `.`, `,`), commas removed.
  `####42` and `#### $42` find nothing and score 0.
- flexible: the last run of digits/`.`/`,`/`-` that is not just `.` (commas kept).
- The found answer is compared with the ground truth as a string: `42.` ≠ `42`, `007` ≠ `7`, and a non-string
  ground truth never matches. Found but wrong gives `format_score`, nothing found gives 0.
The lenient numeric comparison of this project is the separate `hybridrl/lenient_numeric` scorer.
"""

from __future__ import annotations

import re

__all__ = ["compute_score", "extract_solution"]

CLIP_CHARS = 300
_STRICT_ANSWER = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER_LIKE = re.compile(r"(-?[0-9.,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k: method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT_ANSWER.findall(tail)
        return found[-1].replace(",", "") if found else None
    found = _NUMBER_LIKE.findall(tail)
    if not found:
        return None
    usable = [s for s in found if s not in ("", ".")]
    # when every candidate is a lone ".", verl ends its search on the first one found
    return usable[-1] if usable else found[0]


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score
