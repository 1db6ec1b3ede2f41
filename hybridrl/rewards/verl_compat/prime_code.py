"""verl's code sources (`codecontests`, `apps`, `codeforces`, `taco`), judged as verl's `reward_score.prime_code`
judges them (its APPS harness, `continuous=True`), with the program run in hybridrl's sandbox.

verl's rules, kept:
- The program: `completion.split("```python")[-1].split("```")[0]` (a ```py fence is not one).
- `ground_truth`: JSON (or a dict) {"inputs": [...], "outputs": [...], "fn_name"?}. Without `fn_name` each case is
  stdin → stdout; with it, each input line is one JSON argument of `fn_name` (a method of `class Solution` when the
  program defines one) and the output is JSON.
- `input()`, `sys.stdin` and `open(...)` (verl mocks `open` to return the input) read the case's input.
- The program runs after verl's prelude (`from math import *`, `from collections import *`, ... and a recursion limit
  of 600,000), so a solution that uses `sqrt` or `deque` without importing them passes, as it does in verl.
- Score: 1.0 when every case passes within the full check's limits (5 s a case, 6 s in all); otherwise the share of
  the first 10 cases that pass, each run on its own with 10 s.
- Outputs are compared leniently, in verl's order: equal after stripping the whole text (or each line); equal line
  lists once empty lines are dropped and the expected lines stripped; equal as floats line by line (numpy's
  `allclose`, rtol 1e-5, atol 1e-8) when the lines are not all digit strings. A call's result passes when it equals
  the expected JSON value, or its first element, with tuples read as lists; a result `json.dumps` cannot write
  fails, as in verl. A run that raises fails the case; `SystemExit` does not.

What differs, on purpose:
- The verdict is computed here, never in the program's process: the expected outputs do not enter the sandbox,
  which returns only what the program printed (or returned, as plain data) for each input. verl's harness compares
  inside the solution's process, where a program can patch the comparison.
- The cases of the full check run one after another in one sandboxed process, each in fresh globals (verl: one
  process, the program wrapped in a function); a case that the full check settled is not run again for the
  per-case score (verl reruns it in a fresh process), only the ones it did not reach or that timed out.
- Data verl's harness cannot read scores 0 there but is read here: call-based inputs given as argument lists and
  outputs given as values rather than JSON strings (raw APPS rows). No cases at all is an error, not verl's 1.0.
- Time: a program that times out on the first 10 cases can take verl's harness 6 + 10 x 11 = 116 s. Here the
  sample's scorer has `reward_model.timeout_s` (default 10 s): it reads the time left (`score_worker.time_left`),
  fits the full check into it, and runs a case again alone (first the cases the full check never reached, then
  those its alarm cut) only while one fits, with at most 10 s; a case that no longer fits counts as failed
  (`skipped`). So a slow program gets a score, not a reward timeout, and the run's hang check is not tripped by a
  group of slow programs. With `reward_model.timeout_s` >= 117 (or null: no limit) the scores are verl's.
- The sandbox holds the standard library only: a solution importing numpy fails here and may pass in verl, whose
  harness runs in the trainer's environment.
- extra_info may set "memory_mb" (address space of the sandboxed run, default 1024; verl sets no limit).
"""

from __future__ import annotations

import json
import math

from hybridrl.rewards import score_worker
from hybridrl.rewards.code_tests import ENCODER, decode_value
from hybridrl.tools.sandbox import run_python

__all__ = ["call_result_matches", "compute_score", "extract_solution", "parse_cases", "stdout_matches"]

FULL_CASE_S, FULL_TOTAL_S = 5.0, 6.0         # verl: check_correctness(timeout=5): alarm 5 s a case, join 5 + 1 s
SINGLE_CASE_S, SINGLE_EXTRA_S = 10.0, 1.0   # verl: the per-case check, timeout=10: alarm 10 s, join 10 + 1 s
FIRST_CASES = 10                             # verl: `if test_case_id >= 9: break`
VALUES_CAP = 16 << 20                        # printed outputs of every case come back through the values channel
TIMEOUT, SKIPPED = "TimeoutError", "skipped: the per-sample time limit was spent"
MARGIN_S = 0.5        # kept back from the scorer's time limit (reward_model.timeout_s) for the reply
MIN_CASE_S = 0.5      # a case is not started with less than this

PRELUDE = ("from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
           "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
           "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
           "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
           "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
           "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
           "import io\nimport sys\nimport json\nsys.setrecursionlimit(6*10**5)\n")

# The sandboxed program: reads the cases' inputs (a JSON list) from stdin and sends, per case, what the solution
# printed (stdio) or returned (call-based, as plain data), or the name of what it raised.
HARNESS = ENCODER + r'''

def __hybridrl_cases(src, fn_name, case_s, prelude, fd):
    import builtins, io, json, os, signal, sys
    inputs = json.loads(sys.stdin.read())
    real_stdout, real_open = sys.stdout, builtins.open

    def send(i, status, payload):
        os.write(fd, (json.dumps([i, status, payload]) + "\n").encode())

    def over(signum, frame):
        raise TimeoutError("case time limit")

    signal.signal(signal.SIGALRM, over)
    arm = lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)  # noqa: E731
    try:
        code = compile(prelude + src, "<solution>", "exec")
    except BaseException as e:
        send(-1, "compile", type(e).__name__)
        return
    if fn_name is None:
        for i, text in enumerate(inputs):
            status, out = "ok", io.StringIO()
            sys.stdin, sys.stdout = io.StringIO(text), out
            builtins.open = lambda *a, _text=text, **k: io.StringIO(_text)   # verl: mock_open(read_data=input)
            arm(case_s)
            try:
                exec(code, {"__name__": "__main__", "__builtins__": builtins})
            except SystemExit:
                pass
            except BaseException as e:
                status, out = "raised", type(e).__name__
            finally:
                arm(0)
                sys.stdout, builtins.open = real_stdout, real_open
            send(i, status, out.getvalue() if status == "ok" else out)
        return
    g = {"__name__": "tmp_sol", "__builtins__": builtins}
    arm(case_s)
    try:
        exec(code, g)
        method = getattr(g["Solution"](), fn_name) if "class Solution" in src else g[fn_name]
    except BaseException as e:
        arm(0)
        send(-1, "compile", type(e).__name__)
        return
    arm(0)
    for i, text in enumerate(inputs):
        arm(case_s)
        try:
            args = [json.loads(line) for line in text.split("\n")]
            try:
                if isinstance(args[0], dict):
                    args = [{int(k): v for k, v in args[0].items()}]
            except Exception:
                pass
            result = method(*args)
            json.dumps(result)
            line = ("ok", __hybridrl_enc(result))
        except BaseException as e:
            line = ("raised", type(e).__name__)
        finally:
            arm(0)
        send(i, *line)

__hybridrl_cases(%r, %r, %r, %r, __sandbox_values_fd__)
'''


def extract_solution(completion: str) -> str:
    return (completion or "").split("```python")[-1].split("```")[0]


def parse_cases(ground_truth) -> tuple[list[str], list, str | None]:
    """(inputs as text, expected outputs, fn_name) from verl's test-case JSON; ValueError naming the rule."""
    cases = ground_truth
    if isinstance(cases, (str, bytes)):
        try:
            cases = json.loads(cases)
        except json.JSONDecodeError as e:
            raise ValueError(f"prime_code: ground_truth is not JSON ({e})") from e
    if not isinstance(cases, dict) or not isinstance(cases.get("inputs"), list) \
            or not isinstance(cases.get("outputs"), list):
        raise ValueError("prime_code: ground_truth must be {'inputs': [...], 'outputs': [...], 'fn_name'?}, got "
                         f"{type(cases).__name__}")
    inputs, outputs, fn_name = cases["inputs"], cases["outputs"], cases.get("fn_name")
    if len(inputs) != len(outputs):
        raise ValueError(f"prime_code: {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise ValueError("prime_code: ground_truth has no test cases")
    if fn_name is None:
        return ["\n".join(map(str, x)) if isinstance(x, list) else str(x) for x in inputs], outputs, None
    as_lines = lambda x: x if isinstance(x, str) else "\n".join(json.dumps(a) for a in x)  # noqa: E731
    return [as_lines(x) for x in inputs], outputs, str(fn_name)


def _int_like(text: str) -> bool:
    return text.isdigit()


def _allclose(got: list[float], want: list[float]) -> bool:
    """numpy.allclose(got, want) at its defaults: |a - b| <= 1e-8 + 1e-5 |b|, equal infinities, NaN never."""
    for a, b in zip(got, want):
        if math.isinf(a) or math.isinf(b):
            if a != b:
                return False
        elif not abs(a - b) <= 1e-8 + 1e-5 * abs(b):
            return False
    return True


def stdout_matches(printed: str, expected) -> bool:
    """verl's APPS comparison of a program's stdout with the expected output (a str, or a list of lines)."""
    if isinstance(expected, list):
        expected = "\n".join(map(str, expected))
    expected = str(expected)
    lines = printed.splitlines()
    if "\n".join(lines).strip() == expected.strip() or "\n".join(x.strip() for x in lines).strip() == expected.strip():
        return True
    want = [x.strip() for x in expected.split("\n") if x]
    kept = [x for x in lines if x]
    if lines == want or kept == want:
        return True
    if len(kept) != len(want) or all(_int_like(a) and _int_like(b) for a, b in zip(kept, want)):
        return False
    try:
        return _allclose([float(a) for a in kept], [float(b) for b in want])
    except ValueError:
        return False


def _expected_value(raw):
    value = json.loads(raw) if isinstance(raw, str) else raw
    if isinstance(value, dict):
        try:
            value = [{int(k): v for k, v in value.items()}]
        except (ValueError, TypeError):
            pass
    try:
        if isinstance(value[0], dict):
            value = [{int(k): v for k, v in value[0].items()}]
    except (KeyError, IndexError, TypeError, ValueError):
        pass
    return value


def call_result_matches(result, expected_raw) -> bool:
    """verl's APPS comparison of a call's result (plain data) with the expected JSON output."""
    try:
        expected = _expected_value(expected_raw)
    except (ValueError, TypeError):
        return False
    if isinstance(result, tuple):
        result = list(result)
    if result == expected:
        return True
    if isinstance(expected, list) and expected and result == expected[0]:
        return True
    try:
        return isinstance(result[0], tuple) and [list(x) for x in result] == expected[0]
    except (KeyError, IndexError, TypeError):
        return False


def _budget() -> float | None:
    """Seconds left of reward_model.timeout_s for this sample (None: scored in-process, without a limit)."""
    return score_worker.time_left()


def _run_cases(code: str, fn_name, inputs: list[str], case_s: float, total_s: float, memory_mb: int):
    program = HARNESS % (code, fn_name, case_s, PRELUDE)
    r = run_python(program, timeout_s=total_s, memory_mb=memory_mb, stdin=json.dumps(inputs), values=True,
                   max_values_bytes=VALUES_CAP)
    sent: dict[int, tuple[str, object]] = {}
    for line in r.values.decode("utf-8", "replace").splitlines():
        try:
            i, status, payload = json.loads(line)
        except (ValueError, TypeError):
            continue
        if isinstance(i, int) and -1 <= i < len(inputs) and i not in sent and status in ("ok", "raised", "compile"):
            sent[i] = (status, payload)
    return sent, r


def _passes(outcome, expected, fn_name) -> bool:
    status, payload = outcome
    if status != "ok":
        return False
    if fn_name is None:
        return isinstance(payload, str) and stdout_matches(payload, expected)
    try:
        result = decode_value(payload)
    except (ValueError, TypeError, KeyError, RecursionError, OverflowError):
        return False
    return call_result_matches(result, expected)


def compute_score(completion: str, ground_truth, extra_info=None) -> dict:
    extra_info = extra_info if isinstance(extra_info, dict) else {}
    memory_mb = int(extra_info.get("memory_mb", 1024))
    inputs, outputs, fn_name = parse_cases(ground_truth)
    code = extract_solution(completion)
    left = _budget()
    total = FULL_TOTAL_S if left is None else max(0.5, min(FULL_TOTAL_S, left - MARGIN_S))
    outcomes, r = _run_cases(code, fn_name, inputs, min(FULL_CASE_S, total), total, memory_mb)
    report = {"all_passed": False, "timeouts": 0, "errors": 0, "skipped": 0,
              "sandbox_layers": len(r.isolation["applied"])}
    if -1 in outcomes:  # the program did not compile (or fn_name is not defined in it): every case fails
        return {"score": 0.0, "passed": 0, "total": len(inputs), **report, "errors": 1}
    if not r.timed_out and all(i in outcomes and _passes(outcomes[i], outputs[i], fn_name)
                               for i in range(len(inputs))):
        return {"score": 1.0, "passed": len(inputs), "total": len(inputs), **report, "all_passed": True}
    counted = range(min(FIRST_CASES, len(inputs)))
    # the first ten cases the full check did not reach, then those its 5 s alarm cut, each run alone with 10 s
    rerun = sorted((i for i in counted if outcomes.get(i, ("raised", TIMEOUT))[1] == TIMEOUT), key=outcomes.__contains__)
    for i in rerun:
        left = _budget()
        case_s = SINGLE_CASE_S if left is None else min(SINGLE_CASE_S, left - MARGIN_S - SINGLE_EXTRA_S)
        if case_s < MIN_CASE_S:   # the per-sample time limit is spent: this case counts as failed
            outcomes[i] = ("raised", SKIPPED)
            continue
        alone, r = _run_cases(code, fn_name, [inputs[i]], case_s, case_s + SINGLE_EXTRA_S, memory_mb)
        outcomes[i] = alone.get(0, ("raised", TIMEOUT if r.timed_out else "the run ended without a result"))
    final = [outcomes[i] for i in counted]
    passed = sum(_passes(outcomes[i], outputs[i], fn_name) for i in counted)
    return {"score": passed / len(counted), "passed": passed, "total": len(counted), **report,
            "skipped": sum(o == ("raised", SKIPPED) for o in final),
            "timeouts": sum(o == ("raised", TIMEOUT) for o in final),
            "errors": sum(o[0] == "raised" and o[1] not in (TIMEOUT, SKIPPED) for o in final)}
