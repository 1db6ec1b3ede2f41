"""Code-execution reward (data_source "hybridrl/code_exec"): run the generated program against unit tests in the
sandbox (`hybridrl.tools.sandbox.run_python`); the score is the share of tests passed.

- The program: the last fenced ```python (or ```py / ```python3) block of the response, or the whole response
  when it has none.
- `ground_truth` is one of
  * Python test code with asserts (a str that is not JSON): it runs after the program in the same module; the
    score is 1 when it finishes (a random marker printed after the last assert is seen) and 0 otherwise. The
    marker keeps an early `sys.exit(0)` or `os._exit(0)` in the program from passing; it is not proof against a
    program that inspects its own code object to find it (best effort, like the sandbox).
  * stdin/stdout cases: a JSON list of {"input": str, "output": str} (or a dict {"inputs": [...],
    "outputs": [...]}, the layout of verl's code datasets), each run in its own sandbox; output lines are compared
    with trailing whitespace removed.
- Returned: {"score", "passed", "total", "timeouts", "errors", "skipped"}. After the first timeout the remaining
  cases are skipped (counted as failed): a program that hangs once usually hangs on every case, and each costs
  the full timeout. `errors` counts runs that crashed or hit a limit other than the wall-clock timeout (a wrong
  answer is a failed test, not an error; a failed assert is too).
- extra_info may set "timeout_s" (per run, default 5) and "memory_mb" (default 512).
"""

from __future__ import annotations

import json
import re
import secrets

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
    if kind == "asserts":
        total = 1
        marker = "hybridrl-tests-passed-" + secrets.token_hex(16)
        program = f"{code}\n\n# ---- tests\n{tests}\n\nprint({marker!r})\n"
        r = run_python(program, timeout_s=timeout_s, memory_mb=memory_mb)
        if r.ok and marker in r.stdout.splitlines():
            passed = 1
        elif r.timed_out:
            timeouts = 1
        elif not (r.stderr.strip().splitlines() or [""])[-1].startswith("AssertionError"):
            errors = 1  # a crash or a limit; a failed assert is a failed test
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
            "errors": errors, "skipped": skipped}
