r"""OpenAI PRM800K's answer grader (`grade_answer`), as verl's `prime_math` and mathruler (geometry3k) run it.

An answer is right when (a) both sides are equal after the Hendrycks normaliser, or (b) both are equal after
PRM800K's own normaliser (units, `%`, `$`, `million` … dropped; LaTeX turned into text with pylatexenc; lower
case; integers canonicalised), or (c) element by element (tuples and intervals split on commas, brackets must
agree): unreduced fractions must match as written, an integer only matches an integer, anything else is
compared by `sympy.simplify(truth - given) == 0` (skipped for expressions with more than two distinct letters
or with large powers, which can hang sympy).
Two flavours differ in small details, each matching its source: `prime_math` (verl's copy: "liter" is a unit,
sympy gets 10 s) and `mathruler` (spaces and leftover braces dropped at the end of normalisation).
Needs `sympy` and `pylatexenc` (the `math` extra).
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading

from hybridrl.rewards.verl_compat.hendrycks import strip_string

__all__ = ["grade_answer", "normalize_answer", "time_limit"]

FLAVOURS = ("prime_math", "mathruler")
_UNITS = ["degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
          "year", "foot", "feet", "inch", "yard"]
_ENCLOSING_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_GROUPED_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_TUPLE_CHARS = "()[]"
_LATEX_SYMBOLS_AS_TEXT = [("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")]


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TimeoutError in the block after `seconds` (SIGALRM; only in the main thread, elsewhere no limit).

    verl runs each sympy call in a child process for the same purpose; an alarm costs nothing per call."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _raise(signum, frame):
        raise TimeoutError(f"sympy took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def normalize_answer(answer: str | None) -> str | None:
    r"""Hendrycks normalisation after unwrapping an enclosing `\text{...}`; the input when that fails."""
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = _ENCLOSING_TEXT.search(answer)
        if m is not None:
            answer = m.group("text").strip()
        return strip_string(answer)
    except Exception:
        return answer


def _latex_to_text(expr: str) -> str:
    from pylatexenc import latex2text

    # pylatexenc logs a warning for every malformed macro in model text; the verdict is unaffected
    logging.getLogger("pylatexenc").setLevel(logging.ERROR)
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, text in _LATEX_SYMBOLS_AS_TEXT:
        expr = expr.replace(symbol, text)
    return expr.strip()


def _float_or_none(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def _is_integral(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _strip_grouping_commas(expr: str) -> str:
    # 1,000,000 -> 1000000 but (1,234) keeps its comma only when not followed by exactly three digits
    while True:
        stripped = _GROUPED_THOUSANDS.sub(r"\1\3\4", expr)
        if stripped == expr:
            return stripped
        expr = stripped


def _str_is_int(s: str) -> bool:
    value = _float_or_none(_strip_grouping_commas(s))
    return value is not None and _is_integral(value)


def _is_frac(expr: str) -> bool:
    return bool(re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr))


def _prm_normalize(expr: str, flavour: str) -> str:
    m = _ENCLOSING_TEXT.search(expr)
    if m is not None:
        expr = m.group("text")
    for before, after in [("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , "),
                          ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")]:
        expr = expr.replace(before, after)
    for unit in _UNITS + (["liter"] if flavour == "prime_math" else []):
        expr = re.sub(rf"{unit}(es)?(s)? *(\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    value = _float_or_none(expr)
    if value is not None and _is_integral(value):
        expr = str(int(round(value)))
    if "\\" in expr:
        with contextlib.suppress(Exception):
            expr = _latex_to_text(expr)
    expr = re.sub("- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)  # mixed number 7 3/4 -> 7+3/4
    if flavour == "mathruler":
        expr = expr.replace(" ", "").replace("{", "").replace("}", "")
    expr = expr.lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _may_hang_sympy(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    return (len(letters) > 2 or "^{" in expr or "^(" in expr
            or re.search(r"\^[0-9]+\^", expr) is not None or re.search(r"\^[0-9][0-9]+", expr) is not None)


def _equal_under_sympy(truth: str, given: str, seconds: float) -> bool:
    import sympy
    from sympy.parsing import sympy_parser

    expr = f"({truth})-({given})"
    if _may_hang_sympy(expr):
        return False
    transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
    try:
        with time_limit(seconds):
            # at most two distinct letters (checked above) cannot spell code, so parse_expr's eval is safe here
            diff = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)
            return sympy.simplify(diff) == 0
    except Exception:  # parse errors, sympy errors and timeouts all mean "not shown equal"
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_grouping_commas(expr)
    if not expr:
        return []
    if (len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS
            and not any(ch in expr[1:-1] for ch in _TUPLE_CHARS)):
        return [elem.strip() for elem in expr[1:-1].split(",")]
    return [expr]


def grade_answer(given_answer: str | None, ground_truth: str, flavour: str = "prime_math") -> bool:
    if flavour not in FLAVOURS:
        raise ValueError(f"prm800k.grade_answer: flavour must be one of {FLAVOURS}, got {flavour!r}")
    if given_answer is None:
        return False
    if normalize_answer(ground_truth) == normalize_answer(given_answer):
        return True
    truth, given = _prm_normalize(ground_truth, flavour), _prm_normalize(given_answer, flavour)
    if truth == given:
        return True
    if not given:
        return False
    truth_elems, given_elems = _split_tuple(truth), _split_tuple(given)
    if len(truth_elems) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):
        return False  # (a, b) vs [a, b]: different interval types
    if len(truth_elems) != len(given_elems):
        return False
    seconds = 10.0 if flavour == "prime_math" else 60.0  # mathruler sets no limit; 60 s bounds a hang
    for truth_elem, given_elem in zip(truth_elems, given_elems, strict=True):
        if _is_frac(truth_elem) and _is_frac(given_elem):
            correct = truth_elem == given_elem  # an unreduced fraction is not accepted as its value
        elif _str_is_int(truth_elem) != _str_is_int(given_elem):
            correct = False
        else:
            correct = _equal_under_sympy(truth_elem, given_elem, seconds)
        if not correct:
            return False
    return True
