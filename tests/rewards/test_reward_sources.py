"""The reward manager's up-front data-source check follows verl's dispatch: any source verl scores here passes
(e.g. every name starting with 'aime'), code sources are refused as needing a sandbox, unknown ones by name."""

import pytest
from test_custom_and_manager import make_batch, tok  # noqa: F401  (tok is a fixture)

from hybridrl.rewards import RewardManager
from hybridrl.rewards.default import is_scorable, unscorable_sources_error


def test_verl_dispatched_sources_are_known():
    assert all(is_scorable(s) for s in ("aime2026_hard", "aime_custom", "openai/gsm8k", "numina_olympiads", "arith"))
    assert not is_scorable("codecontests") and not is_scorable("mystery")
    assert unscorable_sources_error(["aime_custom", "openai/gsm8k"]) is None


def test_an_aime_source_outside_the_scorer_table_is_scored(tok):  # noqa: F811
    result = RewardManager(tok, timeout_s=None)(make_batch(tok, ["so \\boxed{42}", "Answer: 42", "Answer: 7"],
                                                           ["42", "42", "42"], data_source="aime2026"))
    assert result["reward_tensor"].sum(-1).tolist() == [-1.0, 1.0, -1.0]  # math_dapo: 'Answer:' form, +1 / -1


def test_code_sources_need_a_sandbox_and_unknown_sources_are_named(tok):  # noqa: F811
    with pytest.raises(ValueError, match=r"\['apps'\] need a code sandbox"):
        RewardManager(tok, timeout_s=None)(make_batch(tok, ["print(1)"], ["1"], data_source="apps"))
    with pytest.raises(ValueError, match=r"no rule scorer for data_source\(s\) \['mystery'\]"):
        RewardManager(tok, timeout_s=None)(make_batch(tok, ["#### 1"], ["1"], data_source="mystery"))
