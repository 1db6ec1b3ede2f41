"""Code-execution reward (data_source "hybridrl/code_exec"): run the generated program against unit tests in the
sandbox (`hybridrl.tools.sandbox.run_python`); the score is the share of tests passed.

- The program: the last fenced ```python (or ```py / ```python3) block of the response, or the whole response
  when it has none.
- `ground_truth` is one of
  * Python test code with asserts (a str that is not JSON), or HumanEval's `def check(candidate)` + `check(f)`:
    each assert is a test. Only the calls of the solution's functions go into the sandbox; their values come back
    as plain data over a channel of their own and the asserts are evaluated here (rewards/code_tests.py), so the
    expected values and the verdict never enter the process that runs the solution: a printed marker, an early
    exit, an always-equal object or a rewritten harness cannot pass a test. Test code that cannot be judged that
    way (loops, assignments) is refused (ValueError, a reward error naming the line).
  * stdin/stdout cases: a JSON list of {"input": str, "output": str} (or a dict {"inputs": [...],
    "outputs": [...]}, the layout of verl's code datasets), each run in its own sandbox; output lines are compared
    here with trailing whitespace removed, and only a run that exits 0 within its limits can pass.
- Returned: {"score", "passed", "total", "timeouts", "errors", "skipped", "sandbox_layers"}. The score is
  passed / total. After the first timeout the remaining cases are skipped (counted as failed): a program that
  hangs once usually hangs on every case, and each costs the full timeout. `errors` counts runs that crashed or
  hit a limit other than the wall-clock timeout (for asserts: the run, or a call that raised); a wrong answer is
  a failed test, not an error. `sandbox_layers` is how many kernel layers the last run had (sandbox.py).
- extra_info may set "timeout_s" (per run, default 5) and "memory_mb" (default 512).
"""

from __future__ import annotations

import json
import re

from hybridrl.rewards.code_tests import decode_values, harness_program, judge, parse_assert_tests
from hybridrl.tools.sandbox import run_python

__all__ = ["DATA_SOURCE", "compute_score", "extract_code", "parse_tests"]

DATA_SOURCE = "hybridrl/code_exec"
_FENCE = re.compile(r"```[ \t]*(?:python3|python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(solution_str: str) -> str:
    blocks = _FENCE.findall(solution_str or "")
    return blocks[-1] if blocks else (solution_str or "")


def parse_tests(ground_truth):
    """("io", [(stdin, expected stdout), ...]) or ("asserts", code)."""
    value = ground_truth
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return "asserts", ground_truth
    if isinstance(value, dict) and "inputs" in value and "outputs" in value:
        if len(value["inputs"]) != len(value["outputs"]):
            raise ValueError("code_exec: ground_truth 'inputs' and 'outputs' differ in length")
        return "io", [(str(i), str(o)) for i, o in zip(value["inputs"], value["outputs"])]
    if isinstance(value, list) and all(isinstance(c, dict) and "input" in c and "output" in c for c in value):
        return "io", [(str(c["input"]), str(c["output"])) for c in value]
    if isinstance(value, str):
        return "asserts", value
    raise ValueError("code_exec: ground_truth must be assert-style test code, a JSON list of "
                     "{'input', 'output'} cases, or {'inputs': [...], 'outputs': [...]}")


def _normalize(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    extra_info = extra_info if isinstance(extra_info, dict) else {}
    timeout_s = float(extra_info.get("timeout_s", 5.0))
    memory_mb = int(extra_info.get("memory_mb", 512))
    code = extract_code(solution_str)
    kind, tests = parse_tests(ground_truth)
    passed = timeouts = errors = skipped = 0
    r = None
    if kind == "asserts":
        split = parse_assert_tests(tests)
        total = len(split.checks)
        r = run_python(harness_program(code, split), timeout_s=timeout_s, memory_mb=memory_mb, values=True)
        passed, raised, missing = judge(split, decode_values(r.values, len(split.probes)))
        if r.timed_out:
            timeouts, skipped = 1, missing
        elif raised or (missing and not r.ok):
            errors = 1  # a call that raised, or the run crashed or hit a limit before all values came back
    else:
        total = len(tests)
        for i, (stdin, expected) in enumerate(tests):
            r = run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, stdin=stdin)
            if r.timed_out:
                timeouts += 1
                skipped = total - i - 1
                break
            if not r.ok:
                errors += 1
            elif _normalize(r.stdout) == _normalize(expected):
                passed += 1
    return {"score": passed / total if total else 0.0, "passed": passed, "total": total, "timeouts": timeouts,
            "errors": errors, "skipped": skipped, "sandbox_layers": len(r.isolation["applied"]) if r is not None else 0}
