r"""Lenient MATH-style scorer (data source `hybridrl/lenient_math`): the last `\boxed{...}` (or `\fbox{...}`)
against the ground truth. verl's exact MATH verdict is `hybridrl.rewards.verl_compat.hendrycks`.

Normalisation applied to both sides before comparing (a compact take on verl's `strip_string`):
`$...$` and `\(...\)` removed; `\text{x}`, `\textbf{x}`, `\mbox{x}` → x; `\dfrac`/`\tfrac` → `\frac`;
`\frac12` → `\frac{1}{2}`; `\left`/`\right`, `^\circ`, `\%`, `\!`, spaces removed; a trailing `.0`/`.00` dropped;
a leading `x=` dropped. Then equal strings score 1; failing that, two plain numbers or `\frac{a}{b}` values
that are equal as fractions score 1 (`\frac{2}{4}` = `0.5`, `5.0` = `5`, where verl says no). Braces are
matched by counting, so nested `\boxed{\frac{1}{2}}` works.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["compute_score", "last_boxed_content", "normalize_answer"]

_BOX_MARKERS = ("\\boxed", "\\fbox")


def last_boxed_content(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} / `\\boxed x`, or None."""
    start = max(text.rfind(m) for m in _BOX_MARKERS)
    if start < 0:
        return None
    rest = text[start:]
    marker = next(m for m in _BOX_MARKERS if rest.startswith(m))
    rest = rest[len(marker):]
    if rest.startswith(" "):
        return rest[1:].split("$")[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced braces: no answer


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}, \frac{1}2 -> \frac{1}{2}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    return re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)


def normalize_answer(s: str) -> str:
    s = s.strip()
    s = re.sub(r"^\$+|\$+$", "", s).replace("\\(", "").replace("\\)", "")
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for junk in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\%", "%", "\\!", "\\,", "\\;", "$"):
        s = s.replace(junk, "")
    s = re.sub(r"\s+", "", s)
    s = _fix_fracs(s)
    s = re.sub(r"^[a-zA-Z]=", "", s)
    s = re.sub(r"(\d)\.0+$", r"\1", s)
    return s.rstrip(".")


def _as_fraction(s: str) -> Fraction | None:
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+(\.\d+)?|-?\d+/\d+", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def is_equiv(a: str, b: str) -> bool:
    na, nb = normalize_answer(a), normalize_answer(b)
    if na == nb:
        return True
    fa, fb = _as_fraction(na), _as_fraction(nb)
    return fa is not None and fa == fb


def compute_score(solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0) -> float:
    answer = last_boxed_content(solution_str)
    if answer is None:
        return 0.0
    truth = last_boxed_content(ground_truth) or ground_truth
    return score if is_equiv(answer, truth) else format_score
