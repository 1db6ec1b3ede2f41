r"""DAPO's math scorer (verl's `math_dapo`, used for `math_dapo`, `math`, `math_dapo_reasoning`, `aime*`).

Default (Minerva) check: in the last 300 characters, the text after the last `Answer:` (any case) on its line
is the prediction; prediction and ground truth both go through `normalize_final_answer` (Minerva's
normaliser: keep what follows the last `=`, drop units and filler words, unwrap `\text{}`/`\boxed{}`/`$`,
`\frac12` → `\frac{1}{2}`, `1,000` → `1000`) and must then be equal strings.
`strict_box_verify=True` instead compares the last `\boxed{...}` in the last 100 characters (before the last
pause token when `pause_tokens_index` is given) with the raw ground truth.
Returns verl's dict: `score` 1.0 / -1.0, `acc` (bool), `pred` (the normalised prediction).
"""

from __future__ import annotations

import re

__all__ = ["compute_score", "last_boxed_only_string", "normalize_final_answer", "remove_boxed"]

# (before, after) replacements, applied in this order, then the removals; both lists are Minerva's
_REPLACEMENTS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
_REMOVALS = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
             "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
             "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
             "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
             ",\\!", "{,}", '"', "\\dots"]
# (pattern, replacement) applied in order after the removals
_REWRITES = [(re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),  # keep only the first $...$ span
             (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
             (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
             (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
             (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
             (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),  # \fracab -> \frac{a}{b}
             (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}")]  # \sqrta -> \sqrt{a}
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def last_boxed_only_string(text: str) -> str | None:
    r"""The last `\boxed{...}` with balanced braces, marker included, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == "{") - (text[i] == "}")
        if text[i] == "}" and depth == 0:
            return text[start:i + 1]
    return None


def remove_boxed(boxed: str) -> str:
    if not (boxed.startswith("\\boxed{") and boxed.endswith("}")):
        raise ValueError(f"not a '\\boxed{{...}}' answer: {boxed!r}")
    return boxed[len("\\boxed{"):-1]


def normalize_final_answer(answer: str) -> str:
    answer = answer.split("=")[-1]
    for before, after in _REPLACEMENTS:
        answer = answer.replace(before, after)
    for junk in _REMOVALS:
        answer = answer.replace(junk, "")
    for pattern, replacement in _REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _minerva_verdict(solution_str: str, ground_truth: str) -> tuple[bool, str]:
    found = _ANSWER_LINE.findall(solution_str)
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    return pred == normalize_final_answer(ground_truth), pred


def _strict_box_verdict(solution_str: str, ground_truth: str, pause_tokens_index) -> tuple[bool, str | None]:
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"math_dapo: pause_tokens_index must hold 4 indices, got {pause_tokens_index!r}")
        tail = solution_str[pause_tokens_index[-1] - 100:]
    else:
        tail = solution_str[-100:]
    boxed = last_boxed_only_string(tail)
    pred = remove_boxed(boxed) if boxed is not None else None
    return pred == ground_truth, pred


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
                  pause_tokens_index: list[int] | None = None) -> dict:
    solution_str = solution_str[-300:]  # the longest MATH-500 answer has 159 characters
    if strict_box_verify:
        correct, pred = _strict_box_verdict(solution_str, ground_truth, pause_tokens_index)
    else:
        correct, pred = _minerva_verdict(solution_str, ground_truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
