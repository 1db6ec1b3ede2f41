import json

import pytest

from hybridrl.rewards import arith, countdown, default_compute_score, lenient_math, lenient_numeric
from hybridrl.rewards.expression import ExpressionError, evaluate

LONG_JUNK = "blah " * 5000


@pytest.mark.parametrize("text,method,expected", [
    ("She has 48 + 24 = 72 clips.\n#### 72", "strict", 1.0),
    ("#### 1,000", "strict", 1.0),             # thousands separator
    ("#### 72.0", "strict", 1.0),              # numerically equal
    ("#### 71", "strict", 0.0),                # wrong
    ("The answer is 72", "strict", 0.0),       # no #### in strict mode
    ("The answer is 72", "flexible", 1.0),     # flexible: last number
    ("#### 72\n#### 5", "strict", 0.0),        # two answers: the last one counts
    ("#### 5\n#### 72", "strict", 1.0),
    ("%$#@!! no digits", "flexible", 0.0),     # garbage
    (LONG_JUNK + "#### 72", "strict", 1.0),    # very long, answer at the end
    ("#### 72" + LONG_JUNK, "strict", 0.0),    # very long, answer outside the searched tail
])
def test_lenient_numeric(text, method, expected):
    gt = "1000" if "1,000" in text else "72"
    assert lenient_numeric.compute_score(text, gt, method=method) == expected


def test_lenient_numeric_format_score_and_bad_method():
    assert lenient_numeric.compute_score("#### 3", "72", format_score=0.1) == 0.1
    assert lenient_numeric.compute_score("no answer", "72", format_score=0.1) == 0.0
    with pytest.raises(ValueError, match="method"):
        lenient_numeric.compute_score("#### 3", "3", method="fuzzy")


@pytest.mark.parametrize("text,gt,expected", [
    ("so \\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{ 3.0 }", "3", 1.0),
    ("\\boxed{$10$}", "10", 1.0),
    ("\\boxed{5\\text{ cm}}", "5cm", 1.0),
    ("\\boxed{x = 7}", "7", 1.0),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{8}", "7", 0.0),                       # wrong
    ("The answer is 7", "7", 0.0),                  # no box
    ("\\boxed{1} then \\boxed{7}", "7", 1.0),       # two answers: the last one
    ("\\boxed{7", "7", 0.0),                        # unbalanced garbage
    (LONG_JUNK + "\\boxed{7}", "7", 1.0),           # very long
    ("\\fbox{42}", "\\boxed{42}", 1.0),             # ground truth given boxed
])
def test_lenient_math(text, gt, expected):
    assert lenient_math.compute_score(text, gt) == expected


GT = json.dumps({"numbers": [3, 5, 7, 20], "target": 42})


@pytest.mark.parametrize("text,expected", [
    ("<answer>(20 - 7 - 5) * 3 + 18</answer>", 0.1),  # 18 is not given
    ("<answer>20 + 7 * 3 + 5 - 4</answer>", 0.1),
    ("Steps...\n<answer>(20 + 7) + 3 * 5</answer>", 1.0),
    ("<answer>(20 + 7) + 3 * 5 = 42</answer>", 1.0),   # '= value' suffix allowed
    ("<answer>20 + 7 + 3 + 5</answer>", 0.1),          # right numbers, wrong value
    ("<answer>20 + 7 + 3 * 5 * 5</answer>", 0.1),      # 5 used twice
    ("<answer>20 + 7 * 3</answer>", 0.1),              # 5 unused
    ("<answer>__import__('os')</answer>", 0.1),        # not arithmetic, never evaluated
    ("<answer>3 / (5 - 5) + 20 * 7</answer>", 0.1),    # division by zero is not a crash
    ("(20 + 7) + 3 * 5", 0.0),                         # no answer tag
    ("<answer>1+1</answer> <answer>(20 + 7) + 3 * 5</answer>", 1.0),  # two answers: last counts
    ("<answer>" + "(" * 200 + "3" + ")" * 200 + "</answer>", 0.1),    # deep nesting rejected cheaply
    (LONG_JUNK + "<answer>(20 + 7) + 3 * 5</answer>", 1.0),
])
def test_countdown(text, expected):
    assert countdown.compute_score(text, GT) == expected


def test_countdown_accepts_tinyzero_dict_and_rejects_bad_truth():
    assert countdown.compute_score("<answer>6 / 4 * 2</answer>", {"target": 3, "numbers": [6, 4, 2]}) == 1.0
    with pytest.raises(ValueError, match="target"):
        countdown.compute_score("<answer>1</answer>", '{"numbers": [1]}')


def test_expression_evaluator_is_exact_and_strict():
    assert evaluate("6 / 4 * 2") == 3
    assert evaluate("2 × (3 + 4) ÷ 7") == 2
    for bad in ("2 ** 3", "-3 + 5", "(1 + 2", "1 2", "", "a + 1"):
        with pytest.raises(ExpressionError):
            evaluate(bad)


@pytest.mark.parametrize("text,expected", [("37 + 60 = 97\n#### 97", 1.0), ("#### -5", 0.0), ("97", 0.0),
                                           ("#### 96", 0.0), ("nonsense", 0.0)])
def test_arith(text, expected):
    assert arith.compute_score(text, "97") == expected
    assert arith.compute_score("#### -5", "-5") == 1.0


def test_default_compute_score_dispatch():
    assert default_compute_score("openai/gsm8k", "#### 4", "4") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{4}", "4") == 1.0
    assert default_compute_score("DigitalLearningGmbH/MATH-lighteval", "\\boxed{4}", "5") == 0.0
    assert default_compute_score("arith", "#### 4", "4", extra_info={"split": "test"}) == 1.0
    assert default_compute_score("countdown", "<answer>2 + 2</answer>", {"target": 4, "numbers": [2, 2]}) == 1.0
    # the lenient comparisons keep their own names; verl's sources get verl's stricter verdict
    assert default_compute_score("hybridrl/lenient_numeric", "#### 1,000.", "1000") == 1.0
    assert default_compute_score("openai/gsm8k", "#### 1,000.", "1000") == 0.0
    assert default_compute_score("hybridrl/lenient_math", "\\boxed{\\frac{2}{4}}", "0.5") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{\\frac{2}{4}}", "0.5") == 0.0
    with pytest.raises(ValueError, match="data_source='my/dataset'"):
        default_compute_score("my/dataset", "#### 4", "4")
