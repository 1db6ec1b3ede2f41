"""The code-execution reward: assert-style and stdin/stdout tests, failures, timeouts and errors counted."""

import json

from hybridrl.rewards.code_exec import DATA_SOURCE, compute_score, extract_code
from hybridrl.rewards.default import default_compute_score

ADD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
ASSERTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0"


def test_extract_code_takes_the_last_python_block():
    text = "```python\nx = 1\n```\nbetter:\n```py\nx = 2\n```\n```\nnot python\n```"
    assert extract_code(text).strip() == "x = 2"
    assert extract_code("print(1)") == "print(1)"


def test_asserts_pass_fail_timeout_error():
    assert compute_score(DATA_SOURCE, ADD, ASSERTS) == {"score": 1.0, "passed": 1, "total": 1, "timeouts": 0,
                                                        "errors": 0, "skipped": 0}
    wrong = compute_score(DATA_SOURCE, ADD.replace("a + b", "a - b"), ASSERTS)
    assert wrong["score"] == 0.0 and wrong["errors"] == 0  # a failed assert is a failed test, not an error
    hang = compute_score(DATA_SOURCE, "```python\nwhile True: pass\n```", ASSERTS, {"timeout_s": 1})
    assert hang["score"] == 0.0 and hang["timeouts"] == 1
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
    assert hang == {"score": 0.25, "passed": 1, "total": 4, "timeouts": 1, "errors": 0, "skipped": 2}
    crash = compute_score(DATA_SOURCE, "```python\nprint(1 / int(input()))\n```", cases)
    assert crash["errors"] == 1 and crash["passed"] == 0  # 1/0 crashes; 1/1 prints 1.0, not 1: a wrong answer


def test_dispatch_through_default_compute_score():
    assert default_compute_score(DATA_SOURCE, ADD, ASSERTS)["score"] == 1.0
