r"""PRIME's math scorer (verl's `prime_math`, used for the `numina_*` data sources).

The answer is pulled out of free text (`match_answer`): after the last "answer:" / "answer is", before a
trailing "is the answer", the content of the last `\boxed{..}`/`\fbox{..}` when there is one, then cut before
the last ". " and after the last "is " / "=" / ": " … It is right when PRM800K's `grade_answer` accepts it,
failing that when ToRA's `math_equal` does (with `\pi` read as 3.14159… and, when that fails, as 3.14).
Returns verl's tuple `(is_correct, format_correct, extracted_answer)`; `default_compute_score` keeps the first.
"""

from __future__ import annotations

import math

from hybridrl.rewards.verl_compat.prm800k import grade_answer
from hybridrl.rewards.verl_compat.tora import math_equal

__all__ = ["compute_score", "match_answer"]

_LEADING_MARKERS = ["answer:", "answer is", "answers are"]
_TRAILING_MARKERS = ["is answer", "is the answer", "are answers", "are the answers"]
_FINAL_MARKERS = ["be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n"]


def _last_boxed_content(text: str) -> str | None:
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
    if start < 0:
        return None
    depth, left = 0, None
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
            left = i if left is None else left
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[left + 1:i].strip() if left is not None else None
    return None


def match_answer(response: str) -> tuple[bool, str]:
    """(found an answer with a digit in it, the extracted answer text)."""
    matched = False
    for marker in _LEADING_MARKERS:
        idx = response.lower().rfind(marker)
        if idx != -1:
            matched, response = True, response[idx + len(marker):].strip()
    for marker in _TRAILING_MARKERS:
        idx = response.lower().rfind(marker)
        if idx != -1:
            matched, response = True, response[:idx].strip()
    boxed = _last_boxed_content(response)
    if boxed:
        matched, response = True, boxed
    if ". " in response:
        response = response[:response.lower().rfind(". ")].strip()
    for marker in _FINAL_MARKERS:
        idx = response.lower().rfind(marker)
        if idx != -1:
            matched, response = True, response[idx + len(marker):].strip()
    return matched and any(c.isdigit() for c in response), response


def compute_score(model_output: str, ground_truth: str) -> tuple[bool, bool, str]:
    model_output, ground_truth = str(model_output), str(ground_truth)
    _, answer = match_answer(model_output)
    format_correct = "Step 2:" in model_output and "\\box" in model_output
    if grade_answer(answer, ground_truth, flavour="prime_math"):
        return True, True, answer
    try:
        if "\\pi" in answer or "\\pi" in ground_truth:
            # both readings of pi are computed, so an error in either one makes the answer wrong, as in verl
            verdicts = [math_equal(answer, ground_truth, timeout=True, pi=pi) for pi in (math.pi, 3.14)]
            correct = any(verdicts)
        else:
            correct = math_equal(answer, ground_truth, timeout=True)
    except Exception:
        correct = False
    return correct, format_correct, answer
