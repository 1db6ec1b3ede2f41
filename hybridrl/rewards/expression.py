"""Safe arithmetic-expression evaluation (no Python `eval`), shared by the countdown scorer and the task generators.

Choices:
- A tiny recursive-descent parser over integers, `+ - * /` (also `×`, `x`, `÷`) and parentheses, evaluated with
  `fractions.Fraction` so `6 / 4 * 2` is exactly 3 and no float rounding decides a reward.
- No unary minus, no exponent, no names: a countdown answer may only combine the given numbers, and rejecting
  everything else keeps a model from smuggling in `2**99` or `__import__`.
- Hard limits (expression length, number of literals, nesting depth) so a pathological model output costs
  microseconds, not seconds, to reject.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["ExpressionError", "evaluate", "numbers_in", "tokenize"]

MAX_EXPRESSION_CHARS = 512
MAX_DEPTH = 64
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()×x÷]))")
_OP_ALIASES = {"×": "*", "x": "*", "÷": "/"}


class ExpressionError(ValueError):
    """The text is not a valid arithmetic expression (or divides by zero)."""


def tokenize(text: str) -> list[str]:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExpressionError(f"unexpected character {text[pos]!r} at position {pos}")
        tokens.append(m.group(1) or _OP_ALIASES.get(m.group(2), m.group(2)))
        pos = m.end()
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


def numbers_in(text: str) -> list[int]:
    """The integer literals of the expression, in order."""
    return [int(t) for t in tokenize(text) if t.isdigit()]


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("expression ends too early")
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.atom()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.atom()
            if op == "/" and rhs == 0:
                raise ExpressionError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def atom(self) -> Fraction:
        tok = self.take()
        if tok.isdigit():
            return Fraction(int(tok))
        if tok == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self.expr()
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            self.depth -= 1
            return value
        raise ExpressionError(f"expected a number or '(', got {tok!r}")


def evaluate(text: str) -> Fraction:
    """Exact value of an arithmetic expression; raises ExpressionError on anything else."""
    parser = _Parser(tokenize(text))
    value = parser.expr()
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after a complete expression")
    return value
