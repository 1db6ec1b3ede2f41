"""The reward manager's up-front data-source check follows verl's dispatch: any source verl scores here passes
(e.g. every name starting with 'aime', verl's code sources), unknown ones are refused by name."""

import pytest
from test_custom_and_manager import make_batch, tok  # noqa: F401  (tok is a fixture)

from hybridrl.rewards import RewardManager
from hybridrl.rewards.default import is_scorable, unscorable_sources_error


def test_verl_dispatched_sources_are_known():
    assert all(is_scorable(s) for s in ("aime2026_hard", "aime_custom", "openai/gsm8k", "numina_olympiads", "arith"))
    assert is_scorable("codecontests") and is_scorable("taco") and not is_scorable("mystery")
    assert unscorable_sources_error(["aime_custom", "openai/gsm8k"]) is None


def test_an_aime_source_outside_the_scorer_table_is_scored(tok):  # noqa: F811
    result = RewardManager(tok, timeout_s=None)(make_batch(tok, ["so \\boxed{42}", "Answer: 42", "Answer: 7"],
                                                           ["42", "42", "42"], data_source="aime2026"))
    assert result["reward_tensor"].sum(-1).tolist() == [-1.0, 1.0, -1.0]  # math_dapo: 'Answer:' form, +1 / -1


def test_unknown_sources_are_named(tok):  # noqa: F811
    with pytest.raises(ValueError, match=r"no rule scorer for data_source\(s\) \['mystery'\]"):
        RewardManager(tok, timeout_s=None)(make_batch(tok, ["#### 1"], ["1"], data_source="mystery"))


def test_verl_code_sources_are_scored_in_the_sandbox_through_the_manager(tok):  # noqa: F811
    truth = '{"inputs": ["2\\n"], "outputs": ["4\\n"]}'
    texts = ["```python\nprint(int(input()) * 2)\n```", "```python\nprint(5)\n```"]
    manager = RewardManager(tok, timeout_s=30.0, workers=2)
    try:
        result = manager(make_batch(tok, texts, [truth] * 2, data_source="taco", resp_len=64))
    finally:
        manager.close()
    assert result["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
