"""Non-finite scores and missing ground truths are reward errors (scored 0, counted), and the error guard stops a
run whose samples mostly failed to score."""

import math

import numpy as np
import pytest
import torch
from test_custom_and_manager import make_batch, tok  # noqa: F401  (tok is a fixture)

from hybridrl.algorithms import compute_advantage
from hybridrl.rewards import RewardManager
from hybridrl.rewards.error_guard import RewardErrorGuard, RewardErrorLimitError

SCORES = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "one": 1.0, "half": 0.5}


def score_by_text(data_source, solution_str, ground_truth, extra_info=None):
    """The score the response names (module level: picklable for the timeout worker)."""
    return {"score": SCORES[solution_str.strip()]}


def score_batch_by_text(data_sources, solution_strs, ground_truths, extra_infos):
    assert None not in ground_truths, "a sample without ground truth reached the scorer"
    return [SCORES[s.strip()] for s in solution_strs]


TYPED = {"str": "0.5", "dict_str": {"score": "0.5"}, "none": None, "list": [0.5], "np": np.float32(0.5),
         "int": 1, "bool": True}


def score_by_type(data_source, solution_str, ground_truth, extra_info=None):
    return TYPED[solution_str.strip()]


def test_scores_that_are_not_numbers_are_errors(tok):  # noqa: F811
    """verl puts the score into a tensor, which refuses a string: "0.5" is an error here too, never 0.5."""
    rm = RewardManager(tok, compute_score=score_by_type, timeout_s=None)
    out = rm(make_batch(tok, list(TYPED), ["1"] * len(TYPED)))
    assert out["scores"] == [0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    assert out["metrics"]["reward/errors"] == 4


@pytest.mark.parametrize("timeout_s", [None, 10.0], ids=["in_process", "worker_process"])
def test_non_finite_scores_are_errors_scored_zero(tok, timeout_s):  # noqa: F811
    rm = RewardManager(tok, compute_score=score_by_text, timeout_s=timeout_s)
    try:
        out = rm(make_batch(tok, ["inf", "-inf", "nan", "one"], ["1"] * 4))
    finally:
        rm.close()
    rewards = out["reward_tensor"]
    assert torch.isfinite(rewards).all()
    assert rewards.sum(-1).tolist() == [0.0, 0.0, 0.0, 1.0]
    assert out["metrics"]["reward/errors"] == 3 and out["metrics"]["reward/samples"] == 4


def test_non_finite_scores_never_reach_the_advantages(tok):  # noqa: F811
    data = make_batch(tok, ["inf", "one", "half", "one"], ["1"] * 4)
    rm = RewardManager(tok, compute_score=score_by_text, timeout_s=None)
    data.batch["token_level_rewards"] = rm(data)["reward_tensor"]
    data.non_tensor_batch["uid"] = __import__("numpy").array(["a", "a", "b", "b"], dtype=object)
    out = compute_advantage(data, "grpo", num_repeat=2)
    assert torch.isfinite(out.batch["advantages"]).all()


@pytest.mark.parametrize("mode", ["naive", "batch"])
def test_a_custom_scorer_gets_a_missing_ground_truth_as_none(tok, mode):  # noqa: F811
    seen = []

    def naive(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(ground_truth)
        return 0.25 if ground_truth is None else 1.0

    def batch(data_sources, solution_strs, ground_truths, extra_infos=None):
        return [naive(d, s, g, e) for d, s, g, e in zip(data_sources, solution_strs, ground_truths, extra_infos)]

    rm = RewardManager(tok, compute_score=naive if mode == "naive" else batch, timeout_s=None, mode=mode)
    out = rm(make_batch(tok, ["one", "one", "half"], ["1", None, None]))
    assert seen == ["1", None, None]   # as verl: every sample reaches the function, None included
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.25, 0.25]
    assert out["metrics"]["reward/errors"] == 0 and out["metrics"]["reward/missing_ground_truths"] == 2


def test_the_default_scorer_does_not_score_a_missing_ground_truth(tok):  # noqa: F811
    rm = RewardManager(tok, timeout_s=None)
    out = rm(make_batch(tok, ["#### 1", "#### 1", "#### 1"], ["1", None, float("nan")], data_source="openai/gsm8k"))
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert out["metrics"]["reward/errors"] == 2 and out["metrics"]["reward/missing_ground_truths"] == 2


def test_a_custom_scorer_is_called_by_keyword_in_any_parameter_order(tok):  # noqa: F811
    def reordered(solution_str, ground_truth, data_source=None, extra_info=None):
        return float(solution_str == "one" and ground_truth == "1" and data_source == "x")

    def keyword_only(*, data_source, solution_str, ground_truth, extra_info=None):
        return reordered(solution_str, ground_truth, data_source)

    for fn in (reordered, keyword_only):
        rm = RewardManager(tok, compute_score=fn, timeout_s=None)
        out = rm(make_batch(tok, ["one", "half"], ["1", "1"], data_source="x"))
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0] and out["metrics"]["reward/errors"] == 0


def test_guard_stops_at_the_limit_over_its_window():
    guard = RewardErrorGuard(max_fraction=0.5, window=2)
    assert guard.check(1, {"reward/errors": 1, "reward/samples": 4}) == 0.25
    with pytest.raises(RewardErrorLimitError, match=r"4 of 8 samples in steps 1-2.*max_error_fraction=0.5") as e:
        guard.check(2, {"reward/errors": 1, "reward/timeouts": 2, "reward/samples": 4})
    assert "error_window_steps=2" in str(e.value)


def test_guard_window_survives_a_resume():
    """Saved with the checkpoint: a resumed run counts the failures of the steps before it in its window."""
    guard = RewardErrorGuard(max_fraction=0.5, window=2)
    guard.check(1, {"reward/errors": 1, "reward/samples": 4})
    import json

    resumed = RewardErrorGuard(max_fraction=0.5, window=2)
    resumed.load_state_dict(json.loads(json.dumps(guard.state_dict())))   # as trainer_state.json holds it
    with pytest.raises(RewardErrorLimitError, match=r"4 of 8 samples in steps 1-2"):
        resumed.check(2, {"reward/errors": 3, "reward/samples": 4})
    narrower = RewardErrorGuard(max_fraction=0.5, window=1)   # a smaller window keeps the last steps only
    narrower.load_state_dict({"steps": [[1, 4, 4], [2, 0, 4]]})
    assert narrower.check(3, {"reward/errors": 0, "reward/samples": 4}) == 0.0


def test_guard_default_stops_only_when_every_sample_of_a_step_failed():
    guard = RewardErrorGuard()
    assert guard.check(1, {"reward/errors": 7, "reward/samples": 8}) == 7 / 8
    assert guard.check(2, {"reward/errors": 0, "reward/samples": 8}) == 0.0
    with pytest.raises(RewardErrorLimitError, match="8 of 8 samples in step 3"):
        guard.check(3, {"reward/errors": 8, "reward/samples": 8})
    never = RewardErrorGuard(max_fraction=None)
    assert never.check(1, {"reward/errors": 8, "reward/samples": 8}) == 1.0


@pytest.mark.parametrize("kwargs, key", [({"max_fraction": 0.0}, "max_error_fraction"),
                                         ({"max_fraction": 1.5}, "max_error_fraction"),
                                         ({"window": 0}, "error_window_steps")])
def test_guard_refuses_bad_settings(kwargs, key):
    with pytest.raises(ValueError, match=f"reward_model.{key}"):
        RewardErrorGuard(**kwargs)
