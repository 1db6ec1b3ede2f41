"""verl's scorers: each expected verdict is derived by hand from verl's rules (reward_score/*.py), with the
rule that decides it named in the comment."""

import pytest

from hybridrl.rewards import default_compute_score
from hybridrl.rewards.verl_compat import (
    geo3k,
    gsm8k,
    hendrycks,
    math_dapo,
    prime_math,
    search_r1,
    tora,
    verl_compute_score,
)

pytest.importorskip("sympy")
pytest.importorskip("pylatexenc")


@pytest.mark.parametrize("text,truth,expected", [
    ("so #### 42", "42", 1.0),
    ("####42", "42", 0.0),            # verl needs exactly one space after ####
    ("#### $42", "42", 0.0),          # `$` is not in the answer's character class: nothing found
    ("#### 42.", "42", 0.0),          # the trailing `.` is captured: "42." != "42"
    ("#### 007", "7", 0.0),           # strings, not numbers
    ("#### 1,000", "1000", 1.0),      # commas removed from the answer ...
    ("#### 1000", "1,000", 0.0),      # ... but not from the ground truth
    ("#### 42.0", "42", 0.0),
    ("#### 1\n#### 42", "42", 1.0),   # the last answer counts
    ("#### 42" + "x" * 300, "42", 0.0),  # outside the last 300 characters
    ("#### 42", 42, 0.0),             # a non-string ground truth never matches
])
def test_gsm8k_strict(text, truth, expected):
    assert gsm8k.compute_score(text, truth) == expected


def test_gsm8k_flexible_and_format_score():
    assert gsm8k.compute_score("it is 1,5 or 42", "42", method="flexible") == 1.0
    assert gsm8k.compute_score("costs 1,000", "1000", method="flexible") == 0.0  # commas kept in flexible mode
    assert gsm8k.extract_solution("just . and .", method="flexible") == "."       # verl's fallback quirk
    assert gsm8k.compute_score("#### 41", "42", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer", "42", format_score=0.1) == 0.0
    with pytest.raises(ValueError, match="method must be 'strict' or 'flexible', got 'fuzzy'"):
        gsm8k.extract_solution("#### 1", method="fuzzy")


@pytest.mark.parametrize("text,truth,expected", [
    ("\\boxed{\\frac12}", "\\frac{1}{2}", 1.0),       # \frac12 -> \frac{1}{2}
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),            # exactly "0.5" becomes \frac{1}{2}
    ("\\boxed{.5}", "\\frac{1}{2}", 1.0),             # leading dot: ".5" -> "0.5" -> \frac{1}{2}
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 0.0),   # no arithmetic
    ("\\boxed{5.0}", "5", 0.0),
    ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1.0),           # \sqrt2 -> \sqrt{2}
    ("\\boxed{2\\sqrt 3}", "2\\sqrt{3}", 0.0),        # the space is the "argument": \sqrt{ }3
    ("\\boxed{5\\text{ cm}}", "5", 1.0),              # a `\text{ unit}` on the right is cut
    ("\\boxed{5\\text{cm}}", "5", 0.0),               # ... only with the space
    ("\\boxed{\\$5}", "5", 1.0),                      # `\$` removed
    ("\\boxed{$5$}", "5", 0.0),                       # plain `$` kept
    ("\\boxed{x = 7}", "7", 1.0),                     # short `x =` prefix dropped
    ("\\boxed{10^\\circ}", "10", 1.0),
    ("\\boxed{50\\%}", "50", 1.0),
    ("\\boxed{7/2}", "\\frac{7}{2}", 1.0),            # a/b of plain integers -> \frac{a}{b}
    ("\\fbox{42}", "42", 0.0),                        # \fbox is found but remove_boxed rejects it
    ("\\boxed 42$ more", "42", 1.0),                  # `\boxed x` up to `$`
    ("\\boxed{1} then \\boxed{42}", "42", 1.0),
    ("\\boxed{42", "42", 0.0),                        # braces never close
    ("\\boxed{42}", "\\boxed{42}", 0.0),              # the ground truth is not unboxed
    ("The answer is 42", "42", 0.0),
    ("\\boxed{a\\text{ b}\\text{ c}}", "a\\text{ b}\\text{ c}", 1.0),  # strip fails on both: raw strings equal
])
def test_math_reward(text, truth, expected):
    assert hendrycks.compute_score(text, truth) == expected
    assert default_compute_score("HuggingFaceH4/MATH-500", text, truth) == expected


@pytest.mark.parametrize("text,truth,score,pred", [
    ("Answer: 42", "42", 1.0, "42"),
    ("answer : $1,000$ dollars", "1000", 1.0, "1000"),   # `$..$` unwrapped, "dollars" and commas dropped
    ("Answer: x = \\frac12", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),  # text after the last "=", \fracab
    ("Answer: 42 cm", "42", 1.0, "42"),
    ("Answer: 41\nAnswer: 42", "42", 1.0, "42"),          # the last "Answer:" line
    ("\\boxed{42}", "42", -1.0, "[INVALID]"),             # no "Answer:" at all
    ("Answer: 5.0", "5", -1.0, "5.0"),
])
def test_math_dapo(text, truth, score, pred):
    assert math_dapo.compute_score(text, truth) == {"score": score, "acc": score > 0, "pred": pred}


def test_math_dapo_strict_box_and_aime_dispatch():
    assert math_dapo.compute_score("... \\boxed{42}", "42", strict_box_verify=True)["score"] == 1.0
    assert math_dapo.compute_score("... \\boxed{ 42}", "42", strict_box_verify=True)["score"] == -1.0
    with pytest.raises(ValueError, match="pause_tokens_index must hold 4 indices"):
        math_dapo.compute_score("\\boxed{1}", "1", strict_box_verify=True, pause_tokens_index=[1])
    for source in ("math_dapo", "math", "aime2024", "aime_anything"):
        assert default_compute_score(source, "Answer: 7", "7")["acc"] is True


@pytest.mark.parametrize("text,truth,expected", [
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),   # sympy: 1/2 - 0.5 == 0
    ("So the answer is 1/2", "\\frac{1}{2}", 1.0),         # free text; Hendrycks a/b -> \frac
    ("So the answer is 1/2.", "\\frac{1}{2}", 0.0),        # the final "." stays: "1/2." is not parsed as LaTeX
    ("\\boxed{2/4}", "1/2", 1.0),                          # PRM800K refuses unreduced fractions, ToRA's sympy accepts
    ("\\boxed{4.0}", "4", 1.0),                            # integral float canonicalised
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
    ("\\boxed{[1, 2]}", "(1,2)", 0.0),                     # interval brackets must agree
    ("\\boxed{2\\pi}", "6.28", 1.0),                       # math_equal with pi = 3.14
    ("\\boxed{50\\%}", "0.5", 1.0),                        # percentage: truth*100 accepted
    ("\\boxed{x^2+1}", "1+x^2", 1.0),                      # sympy simplify
    ("\\boxed{x+2}", "x+1", 0.0),
    ("\\boxed{101_2}", "101", 1.0),                        # base subscript dropped
    ("no digits here", "5", 0.0),
])
def test_prime_math(text, truth, expected):
    assert default_compute_score("numina_olympiads", text, truth) == expected


def test_prime_math_tuple_and_match_answer():
    assert prime_math.compute_score("Step 1: x\nStep 2: \\boxed{3}", "3") == (True, True, "3")
    assert prime_math.compute_score("Thus, it is 7. Done", "8")[2] == "7"
    assert prime_math.match_answer("the answer is 12") == (True, "12")
    assert prime_math.match_answer("nothing") == (False, "nothing")


def test_tora_never_runs_model_text_as_python():
    assert tora.safe_arithmetic_eval("2*3.14") == pytest.approx(6.28)
    assert tora.safe_arithmetic_eval("[1, -2]") == [1, -2]
    for code in ("__import__('os').getcwd()", "2**99999", "(lambda: 1)()"):
        with pytest.raises(ValueError):
            tora.safe_arithmetic_eval(code)
    assert tora.math_equal("open('f').read()", "5") is False  # never handed to sympy's parse_expr


@pytest.mark.parametrize("text,truth,expected", [
    ("<think>r</think> so \\boxed{3}", "3", 1.0),         # 0.9 accuracy + 0.1 format
    ("so \\boxed{3}", "3", 0.9),                          # no <think> block
    ("<think>r</think> \\boxed{4}", "3", 0.1),            # format only
    ("<think>r</think> \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("<think>r</think> \\boxed{3", "3", 0.0),              # unclosed box: "None" is graded, and the format fails
])
def test_geometry3k(text, truth, expected):
    assert geo3k.compute_score(text, truth) == pytest.approx(expected)
    assert default_compute_score("hiyouga/geometry3k", text, truth) == pytest.approx(expected)


def test_search_r1_exact_match():
    truth = {"target": ["The Eiffel Tower", "eiffel"]}
    assert search_r1.compute_score("<answer>eiffel tower!</answer>", truth) == 1.0  # articles, punctuation
    assert search_r1.compute_score("<answer>Paris</answer>", truth) == 0.0
    assert search_r1.compute_score("no tags", truth) == 0.0
    assert search_r1.compute_score("<answer>x</answer>" * 11 + "<answer>eiffel</answer>", truth) == 0.25
    assert default_compute_score("searchR1_nq", "<answer>eiffel</answer>", truth) == 1.0


def test_unknown_sources_are_refused():
    with pytest.raises(ValueError, match="data_source='my/data'.*known:"):
        default_compute_score("my/data", "#### 1", "1")
    with pytest.raises(NotImplementedError, match="data_source='my/data'"):
        verl_compute_score("my/data", "#### 1", "1")
