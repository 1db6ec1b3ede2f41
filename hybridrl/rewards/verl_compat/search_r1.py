"""Search-R1 QA exact match (verl's `search_r1_like_qa_em`, data sources `searchR1_*`).

Only the scoring: the search tool itself runs during rollout. The answer is the last `<answer>...</answer>`;
it is right when, lower-cased with punctuation, articles and extra spaces removed, it equals one of
`ground_truth["target"]` (a string or a list). Right scores `score` (a quarter of it when the text holds more
than 10 `<answer>` or `</answer>` tags), wrong `format_score`, no answer 0.
"""

from __future__ import annotations

import re
import string

__all__ = ["compute_score", "normalize_answer"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def compute_score(solution_str: str, ground_truth: dict, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    found = _ANSWER.findall(solution_str)
    if not found:
        return 0.0
    targets = ground_truth["target"]
    targets = [targets] if isinstance(targets, str) else targets
    prediction = normalize_answer(found[-1].strip())
    if not any(normalize_answer(t) == prediction for t in targets):
        return format_score
    too_many_tags = solution_str.count("<answer>") > 10 or solution_str.count("</answer>") > 10
    return score / 4 if too_many_tags else score
