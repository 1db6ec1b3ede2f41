"""Assert-style tests judged outside the process that runs the solution.

Each `assert` of the test code is split, in the parent, into the parts only the solution can compute (calls of
its functions, its names: the *probes*) and the rest (literals, comparisons, `not`/`and`/`or`, arithmetic,
safe builtins such as `len`, `sorted`, `abs`, `math.isclose`). Only the probes go into the sandbox: after the
solution has run, a harness evaluates each one and writes its value, encoded as plain data, to the values
channel (sandbox.run_python(values=True)). The parent decodes the values and evaluates every assert itself.

So the expected values and the verdict never exist in the solution's process: printing a marker, exiting
early (os._exit(0) before the harness runs: no values, every assert fails), returning an object whose `__eq__`
is always true (not plain data: the probe fails), or overwriting the harness (it can only send values, which is
what the solution could have returned anyway) gains nothing.

Choices:
- Accepted test code: `assert` statements, imports (run before the probes in the sandbox; `math` and names taken
  from it are also known to the parent), and HumanEval's layout, a `def check(candidate)` holding asserts plus
  `check(entry_point)`. Anything else (assignments, loops, a comparison inside a comprehension or lambda, which
  would have to run where the solution could forge it) is refused with a ValueError naming the line: such a test
  cannot be judged without trusting the solution's process.
- Values are plain data only (None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset, by
  exact type), so a subclass with custom comparisons cannot cross; a value that is not plain data fails its
  assert.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass

__all__ = ["ENCODER", "AssertTests", "decode_value", "decode_values", "judge", "parse_assert_tests"]

_SAFE_FUNCS = {f.__name__: f for f in (abs, all, any, bool, dict, float, frozenset, int, isinstance, len, list,
                                       max, min, repr, round, set, sorted, str, sum, tuple, type)}
_SAFE_TYPES = {"complex": complex, "bytes": bytes}
_MATH = {n: getattr(math, n) for n in ("isclose", "isnan", "isinf", "isfinite", "fabs", "sqrt", "floor", "ceil",
                                       "pi", "e", "inf", "nan")}
_FORGEABLE = (ast.Compare, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass
class AssertTests:
    """Test code split for judging: `setup` (imports) and `probes` (source run in the sandbox), and one parent-side
    expression per assert whose names `_v0`, `_v1`, ... are the probes' values."""
    setup: list[str]
    probes: list[str]
    checks: list[tuple[int, str, range]]  # (line in the test code, expression over the values, its probes)
    parent_names: dict


class _Splitter(ast.NodeTransformer):
    def __init__(self, rename: dict[str, str], parent_names: dict, line: int):
        self.rename, self.parent_names, self.line = rename, parent_names, line
        self.probes: list[str] = []

    def _probe(self, node: ast.AST) -> ast.Name:
        for sub in ast.walk(node):
            if isinstance(sub, _FORGEABLE):
                raise ValueError(f"code_exec: ground_truth line {self.line}: {type(sub).__name__.lower()} inside "
                                 f"`{ast.unparse(node)}` would be evaluated in the sandbox, where the solution could "
                                 "forge it; write one assert per case comparing a call with its expected value")
            if isinstance(sub, ast.Name) and sub.id in self.rename:
                sub.id = self.rename[sub.id]
        self.probes.append(ast.unparse(node))
        return ast.Name(id=f"_v{len(self.probes) - 1}", ctx=ast.Load())

    def visit_Name(self, node):
        if node.id in self.parent_names:
            return node
        return self._probe(node)

    def visit_Call(self, node):
        f = node.func
        safe = (isinstance(f, ast.Name) and f.id in self.parent_names) or (
            isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math"
            and "math" in self.parent_names and f.attr in _MATH)
        if not safe or any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return self._probe(node)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [ast.keyword(arg=k.arg, value=self.visit(k.value)) for k in node.keywords]
        return node

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "math" and "math" in self.parent_names:
            return node
        return self._probe(node)

    def generic_visit(self, node):
        if isinstance(node, (ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.Tuple,
                             ast.List, ast.Set, ast.Dict, ast.Subscript, ast.Slice, ast.expr_context,
                             ast.operator, ast.boolop, ast.unaryop, ast.cmpop)):
            return super().generic_visit(node)
        return self._probe(node)


def parse_assert_tests(source: str) -> AssertTests:
    """Split assert-style test code (module docstring); ValueError naming the line of what cannot be judged."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"code_exec: ground_truth is not valid Python (line {e.lineno}: {e.msg})") from None
    parent_names: dict = {**_SAFE_FUNCS, **_SAFE_TYPES}
    setup: list[str] = []
    asserts: list[tuple[ast.Assert, dict]] = []
    checkers: dict[str, tuple[str, list]] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            setup.append(ast.unparse(stmt))
            for alias in stmt.names:
                if isinstance(stmt, ast.Import) and alias.name == "math":
                    parent_names[alias.asname or "math"] = math
                elif isinstance(stmt, ast.ImportFrom) and stmt.module == "math" and alias.name in _MATH:
                    parent_names[alias.asname or alias.name] = _MATH[alias.name]
        elif isinstance(stmt, ast.Assert):
            asserts.append((stmt, {}))
        elif isinstance(stmt, ast.FunctionDef) and len(stmt.args.args) == 1 and _only_asserts(stmt.body):
            checkers[stmt.name] = (stmt.args.args[0].arg, [s for s in stmt.body if isinstance(s, ast.Assert)])
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name)
              and stmt.value.func.id in checkers and len(stmt.value.args) == 1
              and isinstance(stmt.value.args[0], ast.Name)):
            param, body = checkers[stmt.value.func.id]
            asserts += [(a, {param: stmt.value.args[0].id}) for a in body]
        elif isinstance(stmt, ast.Assign) and _is_literal(stmt.value) or _is_docstring(stmt):
            continue  # HumanEval's METADATA = {...}: data about the task, not a test
        else:
            raise ValueError(f"code_exec: ground_truth line {stmt.lineno}: `{ast.unparse(stmt)[:80]}` cannot be "
                             "judged outside the sandbox; test code may hold only assert statements, imports and a "
                             "HumanEval check(candidate) function of asserts called on the entry point")
    if not asserts:
        raise ValueError("code_exec: ground_truth holds no assert statement to judge")
    probes: list[str] = []
    checks: list[tuple[int, str, range]] = []
    for stmt, rename in asserts:
        splitter = _Splitter(rename, parent_names, stmt.lineno)
        splitter.probes, first = probes, len(probes)
        expr = splitter.visit(ast.parse(ast.unparse(stmt.test), mode="eval").body)
        checks.append((stmt.lineno, ast.unparse(expr), range(first, len(probes))))
    return AssertTests(setup, probes, checks, parent_names)


def _only_asserts(body) -> bool:
    return all(isinstance(s, ast.Assert) or _is_docstring(s) or isinstance(s, ast.Pass) for s in body)


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _is_literal(node) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return False
    return True


# Defines __hybridrl_enc(value): plain data as JSON-able tags (decoded by decode_value); anything else raises.
ENCODER = r'''
def __hybridrl_enc(v, depth=0):
    import math as _math
    t = type(v)
    if depth > 50:
        raise ValueError("nested too deeply")
    if v is None or t in (bool, int, str):
        return v if t is not int or abs(v) < 2 ** 53 else {"int": str(v)}
    if t is float:
        return v if _math.isfinite(v) else {"float": repr(v)}
    if t is complex:
        return {"complex": [v.real, v.imag]}
    if t is bytes:
        return {"bytes": v.hex()}
    if t in (list, tuple, set, frozenset):
        return {t.__name__: [__hybridrl_enc(x, depth + 1) for x in v]}
    if t is dict:
        return {"dict": [[__hybridrl_enc(k, depth + 1), __hybridrl_enc(x, depth + 1)] for k, x in v.items()]}
    raise TypeError("not plain data: " + t.__name__)
'''

HARNESS = ENCODER + r'''

def __hybridrl_probe_values(probes, fd):
    import json as _json, os as _os
    g = globals()
    for i, src in enumerate(probes):
        try:
            line = ["ok", __hybridrl_enc(eval(src, g))]
        except BaseException as e:
            line = ["raised", type(e).__name__]
        _os.write(fd, (_json.dumps([i] + line) + "\n").encode())

__hybridrl_probe_values(%r, __sandbox_values_fd__)
'''


def harness_program(solution: str, tests: AssertTests) -> str:
    """The program the sandbox runs: the solution, the test code's imports, then the probes' evaluation."""
    return "\n".join([solution, "", *tests.setup, HARNESS % (tests.probes,)])


def decode_value(v):
    """The value __hybridrl_enc encoded (plain data only)."""
    if isinstance(v, list):
        raise TypeError("a bare list is not an encoded value")
    if not isinstance(v, dict):
        return v
    ((tag, x),) = v.items()
    if tag == "int":
        return int(x)
    if tag == "float":
        return float(x)
    if tag == "complex":
        return complex(*x)
    if tag == "bytes":
        return bytes.fromhex(x)
    if tag == "dict":
        return {decode_value(k): decode_value(y) for k, y in x}
    return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode_value(y) for y in x)


def decode_values(raw: bytes, n: int) -> dict[int, tuple[str, object]]:
    """{probe index: ("ok", value) | ("raised", exception name)} from the values channel; the first line for an
    index counts, malformed lines and unknown indices are ignored (they cannot name a verdict)."""
    out: dict[int, tuple[str, object]] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            i, status, payload = json.loads(line)
            if isinstance(i, int) and 0 <= i < n and i not in out and status in ("ok", "raised"):
                out[i] = (status, decode_value(payload) if status == "ok" else str(payload))
        except (ValueError, TypeError, KeyError, RecursionError, OverflowError):
            continue
    return out


def judge(tests: AssertTests, values: dict[int, tuple[str, object]]) -> tuple[int, int, int]:
    """(passed, raised, missing): asserts that hold on the values, asserts with a probe that raised, asserts with
    a probe that sent nothing."""
    passed = raised = missing = 0
    for _, expr, indices in tests.checks:
        got = {f"_v{i}": values.get(i) for i in indices}
        if any(v is None for v in got.values()):
            missing += 1
        elif any(v[0] != "ok" for v in got.values()):
            raised += 1
        else:
            env = {"__builtins__": {}, **tests.parent_names, **{k: v[1] for k, v in got.items()}}
            try:
                passed += bool(eval(expr, env))  # test code and plain data only: nothing of the solution's
            except Exception:
                pass  # e.g. comparing a str with an int: the assert does not hold
    return passed, raised, missing
