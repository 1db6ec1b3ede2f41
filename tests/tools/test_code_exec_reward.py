"""The code-execution reward: assert-style and stdin/stdout tests, failures, timeouts and errors counted."""

import json

import pytest

from hybridrl.rewards.code_exec import DATA_SOURCE, compute_score, extract_code
from hybridrl.rewards.default import default_compute_score
from hybridrl.tools.sandbox import isolation_report
from hybridrl.tools.sandbox_layers import KERNEL_LAYERS

ADD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
ASSERTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0"


def test_extract_code_takes_the_last_python_block():
    text = "```python\nx = 1\n```\nbetter:\n```py\nx = 2\n```\n```\nnot python\n```"
    assert extract_code(text).strip() == "x = 2"
    assert extract_code("print(1)") == "print(1)"


def test_asserts_pass_fail_timeout_error():
    out = compute_score(DATA_SOURCE, ADD, ASSERTS)
    assert out.pop("sandbox_layers") == sum(isolation_report()[k] for k in KERNEL_LAYERS)
    assert out == {"score": 1.0, "passed": 2, "total": 2, "timeouts": 0, "errors": 0, "skipped": 0}
    half = compute_score(DATA_SOURCE, ADD.replace("a + b", "a + b if a > 0 else 5"), ASSERTS)
    assert half["passed"] == 1 and half["score"] == 0.5 and half["errors"] == 0  # each assert is a test
    wrong = compute_score(DATA_SOURCE, ADD.replace("a + b", "a * b"), ASSERTS)
    assert wrong["score"] == 0.0 and wrong["errors"] == 0  # a failed assert is a failed test, not an error
    hang = compute_score(DATA_SOURCE, "```python\nwhile True: pass\n```", ASSERTS, {"timeout_s": 1})
    assert hang["score"] == 0.0 and hang["timeouts"] == 1 and hang["skipped"] == 2
    broken = compute_score(DATA_SOURCE, "```python\ndef add(a, b) return\n```", ASSERTS)
    assert broken["score"] == 0.0 and broken["errors"] == 1


def test_early_exit_does_not_pass():
    for hack in ("import sys\nsys.exit(0)", "import os\nos._exit(0)"):
        assert compute_score(DATA_SOURCE, f"```python\n{hack}\n```", ASSERTS)["score"] == 0.0


def test_stdin_stdout_cases():
    cases = json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"},
                        {"input": "2 2\n", "output": "5\n"}])  # the last expected output is wrong on purpose
    solution = "```python\na, b = map(int, input().split())\nprint(a + b)   \n```"
    out = compute_score(DATA_SOURCE, solution, cases)
    assert out["passed"] == 2 and out["total"] == 3 and abs(out["score"] - 2 / 3) < 1e-9
    verl_layout = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
    assert compute_score(DATA_SOURCE, solution, json.dumps(verl_layout))["score"] == 1.0


def test_timeout_skips_remaining_cases_and_crashes_count_as_errors():
    cases = json.dumps([{"input": str(i), "output": str(i)} for i in range(4)])
    hang = compute_score(DATA_SOURCE, "```python\nx = int(input())\nwhile x >= 1: pass\nprint(x)\n```", cases,
                         {"timeout_s": 1})
    hang.pop("sandbox_layers")
    assert hang == {"score": 0.25, "passed": 1, "total": 4, "timeouts": 1, "errors": 0, "skipped": 2}
    crash = compute_score(DATA_SOURCE, "```python\nprint(1 / int(input()))\n```", cases)
    assert crash["errors"] == 1 and crash["passed"] == 0  # 1/0 crashes; 1/1 prints 1.0, not 1: a wrong answer


def test_dispatch_through_default_compute_score():
    assert default_compute_score(DATA_SOURCE, ADD, ASSERTS)["score"] == 1.0


# Reads the pass marker out of the harness's code (constants of the module's code object, or the source text
# left in the interpreter), prints it and leaves before the tests run: a wrong solution that forges the verdict.
FORGE = """
import gc, os, sys, types
def add(a, b):
    return 0
found = set()
for o in gc.get_objects():
    if isinstance(o, types.CodeType):
        found.update(c for c in o.co_consts if isinstance(c, str) and 'passed' in c)
    elif isinstance(o, str) and 'passed' in o and len(o) < 200:
        found.add(o)
frame = sys._getframe()
while frame is not None:
    found.update(c for c in frame.f_code.co_consts if isinstance(c, str))
    frame = frame.f_back
for marker in found:
    print(marker)
print('passed')
sys.stdout.flush()
os._exit(0)
"""


def test_forged_pass_marker_scores_zero():
    out = compute_score(DATA_SOURCE, f"```python\n{FORGE}\n```", ASSERTS)
    assert out["score"] == 0.0 and out["passed"] == 0, out


def test_forged_io_exit_scores_zero():
    cases = json.dumps([{"input": "1 2\n", "output": "3\n"}])
    out = compute_score(DATA_SOURCE, f"```python\n{FORGE}\n```", cases)
    assert out["score"] == 0.0, out


def test_always_equal_objects_and_a_rewritten_harness_do_not_pass():
    always_equal = "```python\nclass A:\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return A()\n```"
    assert compute_score(DATA_SOURCE, always_equal, ASSERTS)["score"] == 0.0
    # the solution writes made-up values for every probe to the channel and leaves before the harness runs
    forge = ("```python\nimport os, json\nfor i in range(2):\n"
             "    os.write(__sandbox_values_fd__, (json.dumps([i, 'ok', 3]) + '\\n').encode())\nos._exit(0)\n```")
    out = compute_score(DATA_SOURCE, forge, ASSERTS)
    assert out["passed"] == 1, out  # 3 happens to be add(1, 2): sending values is only answering; 0 is not 3


def test_humaneval_layout_and_refused_test_code():
    check = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert abs(candidate(0.1, 0.2) - 0.3) < 1e-9\n\ncheck(add)"
    assert compute_score(DATA_SOURCE, ADD, check)["passed"] == 2
    for bad in ("x = add(1, 2)\nassert x == 3", "assert all(add(a, 1) == a + 1 for a in range(3))",
                "for a in range(3):\n    assert add(a, 0) == a"):
        with pytest.raises(ValueError, match="ground_truth line"):
            compute_score(DATA_SOURCE, ADD, bad)
