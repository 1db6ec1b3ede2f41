"""verl's code sources (codecontests / apps / codeforces / taco) judged as verl's prime_code harness judges them,
the program run in the sandbox. Each expected comparison verdict is derived by hand from verl's testing_util.run_test
(the rule that decides it named in the comment). During development, verl's own run_test agreed with these functions
on 427 generated comparisons, and verl's own prime_code test case (tests/utils/reward_score/test_sandbox_on_cpu.py,
a king's BFS with 11 cases: 1.0, and 0.9 with one expected output changed) scored 1.0 and 0.9 here too."""

import json
import time

import pytest
from test_custom_and_manager import make_batch, tok  # noqa: F401  (tok is a fixture)

from hybridrl.rewards import RewardManager, default_compute_score
from hybridrl.rewards.verl_compat import prime_code as P
from hybridrl.rewards.verl_compat import verl_compute_score


@pytest.mark.parametrize("printed,expected,verdict", [
    ("3\n", "3\n", True),
    ("  3  \n\n", "3", True),                  # the whole text stripped
    ("1 2 \n3\n", "1 2\n3", True),             # each line stripped, then joined
    ("1\n\n2\n", "1\n2\n", True),              # empty printed lines dropped, expected lines stripped
    ("1\r\n2\r\n", "1\n2\n", True),            # splitlines() reads \r\n
    ("3.000001\n", "3\n", True),               # floats, allclose: |a - b| <= 1e-8 + 1e-5 * |b|
    ("3.0001\n", "3\n", False),                # ... outside it
    ("7\n", "007\n", False),                   # both lines digit strings: no float comparison, "7" != "007"
    ("-7\n", "-7.0\n", True),                  # "-7" is not a digit string: compared as floats
    ("1 2\n", "2 1\n", False),                 # a line holding two numbers is not a float
    ("inf\n", "inf\n", True),
    ("nan\n", "nan\n", True),                  # equal text before any float comparison
    ("nan\n", "NaN\n", False),                 # as floats NaN is never close
    ("YES\n", "yes\n", False),                 # case matters
    ("a  b\n", "a b\n", False),                # inner spaces matter
    ("3\n4\n", "3\n", False),                  # a line too many
    ("", "", True),
])
def test_stdout_comparison(printed, expected, verdict):
    assert P.stdout_matches(printed, expected) is verdict


@pytest.mark.parametrize("result,expected,verdict", [
    (3, "3", True),
    ([1, 2], "[1, 2]", True),
    ((1, 2), "[1, 2]", True),                  # a tuple is read as a list
    ([1, 2], "[[1, 2]]", True),                # equal to the expected list's first element
    ([(1, 2), (3, 4)], "[[[1, 2], [3, 4]]]", True),  # a list of tuples against the first element
    ([(1, 2)], "[[1, 2]]", False),             # a list holding a tuple against a list of lists: the tuple stays
    ({1: 2}, '{"1": 2}', True),                # expected dict keys read as ints (and wrapped in a list)
    ({"a": 2}, '{"a": 2}', True),              # keys that are not ints stay
    (2, "[2]", True),
    ("x", '"x"', True),
    (1.0, "1", True),                          # Python's 1.0 == 1
    (True, "1", True),                         # ... and True == 1
    ([], "[]", True),
    (3, "4", False),
    (3, "not json", False),
])
def test_call_result_comparison(result, expected, verdict):
    assert P.call_result_matches(result, expected) is verdict


ADD_CASES = {"inputs": ["1 2\n", "3 4\n", "10 20\n"], "outputs": ["3\n", "7\n", "30\n"]}


def fence(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nDone."


def score(code: str, cases=ADD_CASES, **extra):
    return P.compute_score(fence(code), json.dumps(cases), extra or None)


def test_a_correct_program_scores_one_whichever_way_it_reads_its_input():
    for code in ("a, b = map(int, input().split())\nprint(a + b)",
                 "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
                 "print(sum(map(int, open(0).read().split())))",            # verl mocks open() with the input
                 "print(floor(fsum(map(int, input().split()))))",           # floor, fsum: verl's prelude
                 "import sys\nprint(sum(map(int, input().split())))\nsys.exit(3)",  # SystemExit is not a failure
                 "def main():\n    print(sum(map(int, input().split())))\nif __name__ == '__main__':\n    main()"):
        out = score(code)
        assert out["score"] == 1.0 and out["all_passed"] and out["passed"] == 3, (code, out)


def test_partial_credit_is_the_share_of_the_first_ten_cases():
    cases = {"inputs": [f"{i} 1\n" for i in range(12)], "outputs": [f"{i + 1}\n" for i in range(12)]}
    wrong_at = lambda k: f"a, b = map(int, input().split())\nprint(a + b + (a == {k}))"  # noqa: E731
    out = score(wrong_at(3), cases)
    assert out["score"] == 0.9 and out["passed"] == 9 and out["total"] == 10 and not out["all_passed"]
    # verl's rule: a failure after the tenth case fails the full check, and the first ten all pass
    out = score(wrong_at(11), cases)
    assert out["score"] == 1.0 and not out["all_passed"] and out["total"] == 10


def test_crashes_compile_errors_and_hangs(monkeypatch):
    crash = score("a, b = map(int, input().split())\nprint(a + b if a < 10 else 1 // 0)")
    assert crash["score"] == pytest.approx(2 / 3) and crash["errors"] == 1 and crash["timeouts"] == 0
    assert score("def (:")["score"] == 0.0
    monkeypatch.setattr(P, "FULL_CASE_S", 1.0)
    monkeypatch.setattr(P, "FULL_TOTAL_S", 2.0)
    monkeypatch.setattr(P, "SINGLE_CASE_S", 1.0)
    hang = score("a, b = map(int, input().split())\nwhile a == 10:\n    pass\nprint(a + b)")
    assert hang["score"] == pytest.approx(2 / 3) and hang["timeouts"] == 1, hang   # cut by the alarm, run again
    spin = score("try:\n    while True:\n        pass\nexcept BaseException:\n    while True:\n        pass")
    assert spin["score"] == 0.0 and spin["timeouts"] == 3, spin   # ignores the alarm: the wall clock ends it


def test_call_based_cases():
    cases = {"inputs": ["[1, 2]\n3", "[5]\n1"], "outputs": ["[4, 5]", "[6]"], "fn_name": "shift"}
    method = "class Solution:\n    def shift(self, xs, k):\n        return [x + k for x in xs]"
    assert score(method, cases)["score"] == 1.0
    assert score("def shift(xs, k):\n    return tuple(x + k for x in xs)", cases)["score"] == 1.0
    # a result json cannot write fails, as verl's harness serialises it
    assert score("def shift(xs, k):\n    return {x + k for x in xs}", cases)["score"] == 0.0
    assert score("def other(xs, k):\n    return xs", cases)["score"] == 0.0        # fn_name missing
    keys = {"inputs": ['{"1": 2, "3": 4}'], "outputs": ['{"2": 1}'], "fn_name": "f"}
    assert score("def f(d):\n    return {d[1]: 1}", keys)["score"] == 1.0      # dict keys become ints, as in verl
    raw_apps = {"inputs": [[[1, 2], 3]], "outputs": [[4, 5]], "fn_name": "shift"}    # argument lists, not JSON lines
    assert score(method, raw_apps)["score"] == 1.0


def test_the_verdict_needs_the_expected_output():
    """The expected outputs never enter the sandbox: a program that claims outputs on the values channel for every
    case gets only the cases whose claim is right, and one searching its files for the answer finds nothing."""
    forge = ("import json, os\nfor fd in range(3, 64):\n    for i in range(3):\n        try:\n"
             "            os.write(fd, (json.dumps([i, 'ok', '3\\n']) + '\\n').encode())\n"
             "        except OSError:\n            pass")
    assert score(forge)["passed"] == 1
    secret = {"inputs": ["x\n"], "outputs": ["SECRET_7391\n"]}
    snoop = ("import io, os, sys\nseen = io.open('main.py').read() + str(os.environ)\n"
             "for name in os.listdir('.'):\n    seen += io.open(name, errors='replace').read()\n"
             "print('SECRET_7391' if 'SECRET_7391' in seen else 'absent')")
    assert score(snoop, secret)["score"] == 0.0


def test_bad_test_cases_are_errors_naming_the_rule():
    with pytest.raises(ValueError, match="no test cases"):
        score("print(1)", {"inputs": [], "outputs": []})
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        score("print(1)", {"inputs": ["1", "2"], "outputs": ["1"]})
    with pytest.raises(ValueError, match="not JSON"):
        P.compute_score("print(1)", "{inputs")
    with pytest.raises(ValueError, match="must be"):
        P.compute_score("print(1)", json.dumps([1, 2]))


def test_verl_dispatch_and_extraction():
    assert P.extract_solution("```python\nx = 1\n```\ntext ```python\nprint(2)\n```") == "\nprint(2)\n"
    assert P.extract_solution("```py\nprint(1)\n```") == ""          # verl looks for ```python only
    assert P.extract_solution("print(1)") == "print(1)"              # no fence: the whole completion
    gt = json.dumps(ADD_CASES)
    for source in ("codecontests", "apps", "codeforces", "taco"):
        assert default_compute_score(source, fence("print(sum(map(int, input().split())))"), gt)["score"] == 1.0
    assert verl_compute_score("apps", fence("print(3)"), gt)["score"] == pytest.approx(1 / 3)


def test_a_slow_program_is_scored_within_the_samples_time_limit(tok):  # noqa: F811
    """Through the reward manager with reward_model.timeout_s = 4: the program hangs on the third case, so verl's
    harness would spend 5 + 10 s on it; here the full check fits into the time left, the hanging case no longer
    fits a run of its own and counts as failed (skipped), and the sample gets 2/3 instead of a reward timeout."""
    hang = fence("a, b = map(int, input().split())\nwhile a == 10:\n    pass\nprint(a + b)")
    manager = RewardManager(tok, timeout_s=4.0, workers=1)
    try:
        manager(make_batch(tok, [fence("print(3)")], [json.dumps(ADD_CASES)], data_source="apps", resp_len=160))
        start = time.monotonic()
        out = manager(make_batch(tok, [hang], [json.dumps(ADD_CASES)], data_source="apps", resp_len=160))
        took = time.monotonic() - start
    finally:
        manager.close()
    assert out["reward_tensor"].sum().item() == pytest.approx(2 / 3)
    assert out["reward_extra_info"]["skipped"] == [1] and out["reward_extra_info"]["timeouts"] == [0]
    assert took < 4.0
