r"""ToRA's `math_equal` (the second check of verl's `prime_math`): numeric, then structural, then symbolic.

In order: `$5` / `5%` / `5\%` stripped, `x_b` read as the integer part of x (a base subscript), `\pi` replaced
by a number and the result evaluated; equal as text (case- and space-insensitive); equal as numbers within
`tolerance` (relative), also against truth/100 and truth*100 when `include_percentage`; equal once brackets are
dropped; element-wise for intervals, tuples, `Point(..)` and `pmatrix` answers; finally sympy (`simplify(a - b)
== 0`, else numerically close). Any error makes the answer wrong, as in verl.

Unlike verl, nothing from the model is run through Python's `eval`: `\pi` arithmetic and list literals go
through a small arithmetic evaluator, and text with `__` or attribute access is never handed to sympy's
`parse_expr` (which evaluates its input as Python). verl's `parse_latex` fallback is left out: in verl's own
environment (math-verify pins ANTLR 4.13, sympy's LaTeX parser needs 4.11) it always fails.
"""

from __future__ import annotations

import ast
import math
import operator
import re

from hybridrl.rewards.verl_compat.prm800k import time_limit

__all__ = ["math_equal", "safe_arithmetic_eval"]

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CODE_LIKE = re.compile(r"__|\.[A-Za-z_]|\blambda\b|\bimport\b")
_INTERVALS = [(re.compile(r"^Interval\((.*)\)$"), "[{}]"), (re.compile(r"^Interval\.Ropen\((.*)\)$"), "[{})"),
              (re.compile(r"^Interval\.Lopen\((.*)\)$"), "({}]"), (re.compile(r"^Interval\.open\((.*)\)$"), "({})")]


def safe_arithmetic_eval(text: str):
    """Value of a Python literal made of numbers, + - * / // % **, lists and tuples; ValueError otherwise."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, complex):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 512:
                raise ValueError("exponent too large to evaluate")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.List | ast.Tuple):
            values = [walk(e) for e in node.elts]
            return values if isinstance(node, ast.List) else tuple(values)
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:80]}")

    try:
        return walk(ast.parse(text.lstrip(" \t"), mode="eval"))
    except (SyntaxError, TypeError, ZeroDivisionError, OverflowError, RecursionError) as e:
        raise ValueError(f"cannot evaluate {text[:80]!r}: {e}") from e


def _substitute_pi(text: str, pi: float):
    idx = text.find("\\pi")
    while idx != -1:
        factor = "*" if idx > 0 and text[idx - 1].isdigit() else "1*"
        text = text[:idx] + f"{factor}{pi}" + text[idx + 3:]
        idx = text.find("\\pi", idx + 1)
    try:
        return safe_arithmetic_eval(text)
    except ValueError:
        return text


def _normalize(answer, pi: float):
    if not isinstance(answer, str):
        return answer
    if re.match(r"\$\d+(\.\d+)?", answer):
        return answer[1:]
    if re.match(r"^\d+(\.\d+)?%$", answer) or re.match(r"^\d+(\.\d+)?\\%$", answer):
        return answer.replace("\\%", "").replace("%", "")
    if "_" in answer:  # base subscript: 101_2 -> 101; a non-number before "_" raises (answer judged wrong)
        return int(float(answer.split("_")[0]))
    if "\\pi" in answer:
        return _substitute_pi(answer, pi)
    return answer


def _as_number(value) -> float | None:
    text = str(value)
    try:
        return float(text.replace("{,}", "") if "{,}" in text else text.replace(",", ""))
    except ValueError:
        return None


def _format_interval(prediction: str) -> str:
    for pattern, template in _INTERVALS:
        m = pattern.match(prediction)
        if m:
            return template.format(m.group(1))
    return prediction


def _parse_python_math(text: str):
    from sympy.parsing.sympy_parser import parse_expr

    if _CODE_LIKE.search(text):
        raise ValueError(f"refusing to hand code-like text to sympy: {text[:80]!r}")
    return parse_expr(text)


def _parse_or_text(text: str, seconds: float):
    """parse_expr's result; on failure the text itself (verl keeps it, and sympy's N() may still read it), or
    None for code-like text, which nothing equals."""
    try:
        with time_limit(seconds):
            return _parse_python_math(text)
    except Exception:
        return None if _CODE_LIKE.search(text) else text


def _symbolic_equal(a: str, b: str, tolerance: float, seconds: float) -> bool:
    from sympy import N, simplify

    a_val, b_val = _parse_or_text(a, seconds), _parse_or_text(b, seconds)
    if a_val is None or b_val is None:
        return False
    try:
        with time_limit(seconds):
            if simplify(a_val - b_val) == 0:
                return True
    except Exception:
        pass
    try:
        with time_limit(seconds):
            return math.isclose(N(a_val), N(b_val), rel_tol=tolerance)
    except Exception:
        return False


def _all_equal(preds, refs, include_percentage: bool, tolerance: float) -> bool:
    # every pair is compared (no short-circuit): an error in any pair makes the whole answer wrong, as in verl
    return all([math_equal(p, r, include_percentage, tolerance) for p, r in zip(preds, refs, strict=False)])


def _pmatrix_rows(reference: str) -> list:
    for prefix in (r"\\begin{pmatrix}", r"\begin{pmatrix}"):
        reference = reference.removeprefix(prefix)
    for suffix in (r"\\end{pmatrix}", r"\end{pmatrix}"):
        reference = reference.removesuffix(suffix)
    return [row.split("&") if "&" in row else row for row in reference.split("\\")]


def _equal_as_structures(prediction: str, reference: str, include_percentage: bool,
                          tolerance: float) -> bool | None:
    """True/False when the structure decides; None to go on to the symbolic check."""
    if (prediction and reference and prediction[0] in "([" and prediction[-1] in ")]"
            and prediction[0] == reference[0] and prediction[-1] == reference[-1]):
        preds, refs = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(preds) == len(refs) and _all_equal(preds, refs, include_percentage, tolerance):
            return True
    if "," in prediction and "," in reference:
        preds = [p.strip() for p in prediction.split(",")]
        refs = [r.strip() for r in reference.split(",")]
        if len(preds) == len(refs):
            return _all_equal(preds, refs, include_percentage, tolerance)
    if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":
        preds = prediction[prediction.find("(") + 1:-1].split(",")
        refs = reference[1:-1].split(",")
        if len(preds) == len(refs) and _all_equal(preds, refs, include_percentage, tolerance):
            return True
    if r"\begin{pmatrix}" in reference and prediction.startswith("Matrix"):
        try:
            pred_matrix = _parse_python_math(prediction)
            refs = reference.split()[1:-1:2]
            if len(pred_matrix) == len(refs) and _all_equal(pred_matrix, refs, include_percentage, tolerance):
                return True
        except Exception:
            pass
    elif r"\begin{pmatrix}" in reference and prediction.startswith("[") and prediction.endswith("]"):
        pred_matrix = safe_arithmetic_eval(prediction)  # unevaluable: raises, the answer is wrong
        if isinstance(pred_matrix, list):
            try:
                refs = _pmatrix_rows(reference)
                if len(pred_matrix) == len(refs) and _all_equal(pred_matrix, refs, include_percentage, tolerance):
                    return True
            except Exception:
                pass
    return None


def math_equal(prediction, reference, include_percentage: bool = True, tolerance: float = 1e-4,
               timeout: float = 10.0, pi: float = math.pi) -> bool:
    """True when prediction and reference are the same answer (see the module docstring); may raise on
    malformed input (callers treat that as wrong)."""
    prediction, reference = _normalize(prediction, pi), _normalize(reference, pi)
    if isinstance(prediction, str) and len(prediction) > 1000:
        prediction = prediction[:1000]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    pred_num, ref_num = _as_number(prediction), _as_number(reference)
    if pred_num is not None and ref_num is not None:
        candidates = [ref_num / 100, ref_num, ref_num * 100] if include_percentage else [ref_num]
        return any(math.isclose(c, pred_num, rel_tol=tolerance) for c in candidates)
    if not prediction and prediction not in [0, False]:
        return False
    reference, prediction = str(reference).strip(), _format_interval(str(prediction).strip())
    pred_bare, ref_bare = prediction, reference
    if ((prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("("))
            or (prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("["))):
        pred_bare, ref_bare = pred_bare.strip("[]()"), ref_bare.strip("[]()")
    for bracket in "{}()":
        pred_bare, ref_bare = pred_bare.replace(bracket, ""), ref_bare.replace(bracket, "")
    if pred_bare == ref_bare:
        return True
    verdict = _equal_as_structures(prediction, reference, include_percentage, tolerance)
    if verdict is not None:
        return verdict
    # verl passes timeout=True from prime_math (a 1-second limit); keep that reading of a bool
    return _symbolic_equal(prediction, reference, tolerance, float(timeout))
