"""DAPO's soft overlong punishment (reward_model.overlong_buffer) in the reward manager, by hand."""

import pytest
import torch

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.protocol import DataProto
from hybridrl.rewards.reward_manager import OverlongBuffer, RewardManager, overlong_reward


class CountingTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return f"{len(ids)} tokens"


def batch_of_lengths(lengths, resp_len=20, prompt_len=2):
    mask = torch.zeros(len(lengths), resp_len, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    attention = torch.cat([torch.ones(len(lengths), prompt_len, dtype=torch.long), mask], 1)
    return DataProto({"responses": torch.ones(len(lengths), resp_len, dtype=torch.long), "response_mask": mask,
                      "attention_mask": attention},
                     {"data_source": ["x"] * len(lengths),
                      "reward_model": [{"ground_truth": "1"}] * len(lengths)})


def test_penalty_is_zero_until_the_buffer_then_linear_to_minus_factor():
    buf = OverlongBuffer(length=5, penalty_factor=1.0, max_response_length=20)  # the buffer starts at 15 tokens
    assert [overlong_reward(n, buf) for n in (0, 10, 15)] == [0.0, 0.0, 0.0]
    assert overlong_reward(17, buf) == pytest.approx(-0.4)  # 2 of 5 buffer tokens used
    assert overlong_reward(20, buf) == pytest.approx(-1.0)
    assert overlong_reward(20, OverlongBuffer(5, 0.5, 20)) == pytest.approx(-0.5)


def test_manager_adds_the_penalty_on_the_last_valid_token_and_logs_it():
    manager = RewardManager(CountingTokenizer(), compute_score=lambda data_source, solution_str, ground_truth, extra_info: 1.0, timeout_s=None,
                            overlong_buffer=OverlongBuffer(5, 1.0, 20, log=True))
    out = manager(batch_of_lengths([10, 17, 20, 0]))
    totals = out["reward_tensor"].sum(-1).tolist()
    assert totals == pytest.approx([1.0, 0.6, 0.0, 1.0])
    assert out["reward_tensor"][1, 16] == pytest.approx(0.6)  # on token 17, the last valid one
    assert out["scores"] == [1.0, 1.0, 1.0, 1.0]  # the scorer's, before the penalty
    assert out["reward_extra_info"]["overlong_reward"] == pytest.approx([0.0, -0.4, -1.0, 0.0])
    assert out["reward_extra_info"]["overlong"] == [False, True, True, False]
    assert out["metrics"]["reward/overlong_samples"] == 2
    assert out["metrics"]["reward/overlong_reward_mean"] == pytest.approx(-1.4 / 4)
    plain = RewardManager(CountingTokenizer(), compute_score=lambda data_source, solution_str, ground_truth, extra_info: 1.0, timeout_s=None,
                          overlong_buffer=OverlongBuffer(5, 1.0, 20))
    assert "overlong_reward" not in plain(batch_of_lengths([20]))["reward_extra_info"]  # log: false


def test_validation_refuses_bad_buffers_naming_key_value_and_rule():
    with pytest.raises(ConfigError, match=r"'reward_model.overlong_buffer.len' = 600 must be in \(0, "
                                          r"data.max_response_length = 512\]"):
        load_config(overrides=["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=600"])
    with pytest.raises(ConfigError, match=r"'reward_model.overlong_buffer.len' = 0"):
        load_config(overrides=["reward_model.overlong_buffer.enable=true"])
    with pytest.raises(ConfigError, match=r"'reward_model.overlong_buffer.penalty_factor' = -1.0 must be >= 0"):
        load_config(overrides=["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=64",
                               "reward_model.overlong_buffer.penalty_factor=-1.0"])
    load_config(overrides=["reward_model.overlong_buffer.len=600"])  # off: not checked
    with pytest.raises(ValueError, match=r"overlong_buffer.len=0: must be in \(0"):
        OverlongBuffer(0, 1.0, 20)


def test_verl_dapo_reward_manager_name_is_read_as_naive():
    cfg = load_config(overrides=["reward_model.reward_manager=dapo"])
    assert cfg.reward_model.reward_manager == "naive"
