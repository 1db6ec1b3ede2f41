"""Built-in tools: plain functions str -> str, a registry `TOOLS` and OpenAI/Hermes-style specs `TOOL_SPECS`.

- `calculator(expression)`: exact arithmetic over `ast` (no eval): numbers, + - * / // % **, parentheses, unary
  +/-. Integers are unbounded up to MAX_DIGITS digits (the point of the tool: big-number arithmetic a model cannot
  do in its head); `/` of integers stays an integer when exact, else a float. Exponents are checked before they
  are computed, so `9**9**9` is an error string, not a hung worker.
- `python_executor(code)`: runs the code in `hybridrl.tools.sandbox.run_python`; returns stdout, or an error text.
Errors are returned as strings starting with "Error:" (a tool message the model reads), never raised.
"""

from __future__ import annotations

import ast
import json
import math
import operator

from hybridrl.tools.sandbox import SandboxResult, SandboxStats, run_python

__all__ = ["MAX_DIGITS", "TOOLS", "TOOL_SPECS", "calculator", "call_tool", "python_executor", "run_python_tool"]

MAX_DIGITS = 10_000
MAX_EXPRESSION_CHARS = 20_000
_MAX_BITS = int(MAX_DIGITS * math.log2(10)) + 1
_MAX_DEPTH = 100
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod}


class _CalcError(Exception):
    pass


def _int_to_str(n: int) -> str:
    """str(n) without Python's 4300-digit conversion limit (chunks of 1000 digits)."""
    if abs(n) < 10 ** 4000:
        return str(n)
    sign, n = ("-" if n < 0 else ""), abs(n)
    chunks, base = [], 10 ** 1000
    while n:
        n, r = divmod(n, base)
        chunks.append(r)
    return sign + str(chunks[-1]) + "".join(f"{c:01000d}" for c in reversed(chunks[:-1]))


def _check(value):
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise _CalcError(f"result too large (more than {MAX_DIGITS} digits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise _CalcError("result is not a finite number")
    return value


def _pow(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b >= 0:
            if abs(a) > 1 and (abs(a).bit_length() - 1) * b > _MAX_BITS:
                raise _CalcError(f"result too large (more than {MAX_DIGITS} digits)")
            return a ** b
    try:
        result = float(a) ** float(b)
    except OverflowError:
        raise _CalcError("result too large for a float") from None
    except ZeroDivisionError:
        raise _CalcError("division by zero (0 to a negative power)") from None
    if isinstance(result, complex):
        raise _CalcError("a negative number to a fractional power is not a real number")
    return result


def _div(a, b):
    if b == 0:
        raise _CalcError("division by zero")
    if isinstance(a, int) and isinstance(b, int):
        if a % b == 0:
            return a // b
        try:
            return a / b
        except OverflowError:
            raise _CalcError("quotient too large for a float (not an exact integer division)") from None
    return a / b


def _eval(node, depth: int = 0):
    if depth > _MAX_DEPTH:
        raise _CalcError("expression nested too deeply")
    if isinstance(node, ast.Expression):
        return _eval(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise _CalcError(f"unsupported value {node.value!r}: only numbers")
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, depth + 1)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _check(_pow(a, b))
        if isinstance(node.op, ast.Div):
            return _check(_div(a, b))
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise _CalcError(f"unsupported operator {type(node.op).__name__}; use + - * / // % ** and parentheses")
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
            raise _CalcError("division by zero")
        try:
            return _check(fn(a, b))
        except OverflowError:
            raise _CalcError("result too large for a float") from None
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"name {node.id!r}"
    elif isinstance(node, ast.Call):
        what = "function call"
    raise _CalcError(f"unsupported syntax ({what}); use numbers, + - * / // % ** and parentheses")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly; the result as a string, or "Error: ..."."""
    if not isinstance(expression, str):
        return "Error: the expression must be a string"
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/").replace("−", "-")
    text = text.replace(",", "")  # digit grouping: 1,000,000
    if not text:
        return "Error: empty expression"
    if len(text) > MAX_EXPRESSION_CHARS:
        return f"Error: expression longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as e:
        return f"Error: invalid expression ({getattr(e, 'msg', None) or e})"
    except RecursionError:
        return "Error: expression nested too deeply"
    try:
        value = _eval(tree)
    except _CalcError as e:
        return f"Error: {e}"
    except RecursionError:
        return "Error: expression nested too deeply"
    if isinstance(value, int):
        return _int_to_str(value)
    if value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value)


PYTHON_TOOL_STATS = SandboxStats()


def python_executor(code: str, *, timeout_s: float = 10.0, memory_mb: int = 512) -> str:
    """Run `code` in the sandbox; stdout (print what you need), or "Error: ..." with the end of stderr."""
    return run_python_tool(code, timeout_s=timeout_s, memory_mb=memory_mb)[0]


def run_python_tool(code: str, *, timeout_s: float = 10.0, memory_mb: int = 512,
                    require=None) -> tuple[str, SandboxResult | None]:
    """`python_executor`'s text and the sandbox result it came from (None when no code was run). `require`: the
    sandbox layers the run must have (run_python's); SandboxUnavailableError when this machine lacks one."""
    if not isinstance(code, str) or not code.strip():
        return "Error: no code given", None
    r = run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, require=require, stats=PYTHON_TOOL_STATS)
    return _python_text(r, timeout_s, memory_mb), r


def _python_text(r: SandboxResult, timeout_s: float, memory_mb: int) -> str:
    out = r.stdout + ("\n[output truncated]" if r.stdout_truncated else "")
    if r.ok:
        return out if out.strip() else "(no output; use print() to show results)"
    why = {"timeout": f"timed out after {timeout_s:g}s", "cpu": "CPU time limit exceeded",
           "memory": f"memory limit ({memory_mb} MB) exceeded", "file_size": "file size limit exceeded",
           "refused": "operation not allowed in the sandbox"}.get(r.killed_reason or "", None)
    tail = r.stderr.strip()[-2000:]
    head = f"Error: {why}" if why else f"Error: exit code {r.exit_code}"
    return "\n".join(x for x in (out.rstrip(), head, tail) if x)


TOOLS = {"calculator": calculator, "python": python_executor}

TOOL_SPECS = [
    {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly (integers of any size up to 10000 digits). "
                       "Supports + - * / // % ** and parentheses.",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string",
                                                     "description": "e.g. (123456789 * 987654321) - 42"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "python",
        "description": "Run Python 3 code (standard library only, no network, no files outside a scratch "
                       "directory, 10 s limit) and return what it prints.",
        "parameters": {"type": "object",
                       "properties": {"code": {"type": "string", "description": "a Python program; print results"}},
                       "required": ["code"]}}},
]


def call_tool(name: str, arguments) -> str:
    """Dispatch a parsed tool call (arguments: a dict or its JSON text) to TOOLS; errors as "Error: ..."."""
    fn = TOOLS.get(name)
    if fn is None:
        return f"Error: unknown tool {name!r}; available: {sorted(TOOLS)}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return f"Error: tool arguments are not valid JSON ({e.msg})"
    if not isinstance(arguments, dict):
        return "Error: tool arguments must be a JSON object"
    spec = next(s["function"] for s in TOOL_SPECS if s["function"]["name"] == name)
    required = spec["parameters"]["required"]
    missing = [k for k in required if k not in arguments]
    unknown = [k for k in arguments if k not in spec["parameters"]["properties"]]
    if missing or unknown:
        return f"Error: tool {name!r} takes {required}; missing {missing}, unknown {unknown}"
    return fn(**arguments)
