r"""Geometry3K (verl's `geo3k`, data source `hiyouga/geometry3k`): 0.9 × accuracy + 0.1 × format.

Accuracy: mathruler's `grade_answer` (PRM800K's grader, mathruler flavour) on the content of the last
`\boxed{...}` (the literal text "None" when there is no complete box), or on the whole text with
`use_boxed=False`. Format: the text is `<think>…</think>…\boxed{…}…`.
"""

from __future__ import annotations

import re

from hybridrl.rewards.verl_compat.prm800k import grade_answer

__all__ = ["compute_score", "extract_boxed_content"]

_THINK_THEN_BOX = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def extract_boxed_content(text: str) -> str:
    start = text.rfind("\\boxed{")
    if start == -1:
        return "None"
    depth = 0
    content = text[start + len("\\boxed{"):]
    for i, ch in enumerate(content):
        depth += (ch == "{") - (ch == "}")
        if depth == -1:
            return content[:i].strip()
    return "None"


def format_reward(text: str) -> float:
    return 1.0 if _THINK_THEN_BOX.fullmatch(text) else 0.0


def acc_reward(text: str, ground_truth: str, use_boxed: bool = True) -> float:
    answer = extract_boxed_content(text) if use_boxed else text
    return 1.0 if grade_answer(answer, ground_truth, flavour="mathruler") else 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    return ((1.0 - format_score) * acc_reward(predict_str, ground_truth, use_boxed)
            + format_score * format_reward(predict_str))
