r"""The Hendrycks MATH answer normaliser and `\boxed` extraction, as verl's `math_reward` (lm-eval-harness) does it.

`strip_string` normalises an answer string step by step (the order matters and is verl's): drop newlines and
`\!`, `\\` → `\`, `tfrac`/`dfrac` → `frac`, drop `\left`/`\right`, degree marks and `\$`, cut a unit written as
`\text{ ...}`, drop `\%`, `.5` → `0.5` (at the start, after a space or `{`), drop a short `k =` prefix,
`\sqrt3` → `\sqrt{3}`, drop spaces, `\frac12` → `\frac{1}{2}`, exactly `0.5` → `\frac{1}{2}`, and `a/b` of two
canonical integers → `\frac{a}{b}`. Malformed input (a second `\text{ `, a trailing `\sqrt` or `\frac`) raises,
and `is_equiv` then falls back to comparing the raw strings, as verl does. Nothing else is equated:
`\frac{2}{4}` ≠ `\frac{1}{2}`, `5.0` ≠ `5`.
"""

from __future__ import annotations

__all__ = ["compute_score", "is_equiv", "last_boxed_only_string", "remove_boxed", "strip_string"]


def last_boxed_only_string(text: str) -> str | None:
    r"""The last `\boxed{...}` with balanced braces (or `\boxed x` up to a `$`, or a `\fbox{...}` when there is
    no `\boxed`), marker included; None when there is none or its braces never close."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    return None


def remove_boxed(boxed: str) -> str:
    r"""Content of `\boxed x` or `\boxed{x}`; anything else (an `\fbox{..}` included) is a ValueError."""
    if "\\boxed " in boxed:
        if not boxed.startswith("\\boxed "):
            raise ValueError(f"not a '\\boxed ' answer: {boxed!r}")
        return boxed[len("\\boxed "):]
    if not (boxed.startswith("\\boxed{") and boxed.endswith("}")):
        raise ValueError(f"not a '\\boxed{{...}}' answer: {boxed!r}")
    return boxed[len("\\boxed{"):-1]


def _fix_fracs(s: str) -> str:
    head, *tails = s.split("\\frac")
    out = [head]
    for tail in tails:
        if tail[0] == "{":  # an empty tail (trailing \frac) raises IndexError, as in verl
            out.append("\\frac" + tail)
        elif len(tail) < 2:
            return s
        elif tail[1] == "{":
            out.append("\\frac{" + tail[0] + "}" + tail[1:])
        else:
            out.append("\\frac{" + tail[0] + "}{" + tail[1] + "}" + tail[2:])
    return "".join(out)


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _remove_right_units(s: str) -> str:
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError(f"more than one '\\text{{ ' unit in {s!r}")
    return parts[0]


def _fix_sqrt(s: str) -> str:
    head, *tails = s.split("\\sqrt")
    # an empty tail (trailing \sqrt, or \sqrt\sqrt) raises IndexError, as in verl
    return head + "".join("\\sqrt" + (t if t[0] == "{" else "{" + t[0] + "}" + t[1:]) for t in tails)


def strip_string(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _remove_right_units(s)
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return strip_string(a) == strip_string(b)
    except Exception:  # malformed LaTeX or a non-string: verl compares the raw values
        return a == b


def compute_score(solution_str: str, ground_truth) -> float:
    r"""1.0 when the last `\boxed` answer equals the (unboxed) ground truth after `strip_string`, else 0.0."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    try:
        answer = remove_boxed(boxed)
    except ValueError:
        return 0.0
    return 1.0 if is_equiv(answer, ground_truth) else 0.0
