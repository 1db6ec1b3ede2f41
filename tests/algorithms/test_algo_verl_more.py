"""verl's further estimators (grpo_passk, opo, gpg, the vectorised grpo / rloo) and policy losses (sapo, geo_mean),
each against a hand-computed value; verl's agg_loss dp_size convention and kl_cov's null coefficient."""

import math

import numpy as np
import pytest
import torch

from hybridrl.algorithms import agg_loss, compute_advantage, get_adv_estimator_fn, get_policy_loss_fn
from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.protocol import DataProto


def _outcome(scores, width=3, lengths=None):
    """[B, width] rewards with each score on its row's last response token; mask of `lengths` tokens."""
    lengths = lengths or [width] * len(scores)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    rewards = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        rewards[i, n - 1] = s
    return rewards, mask


def _adv(name, scores, index, lengths=None, **config):
    rewards, mask = _outcome(scores, lengths=lengths)
    adv, ret = get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask, index=np.array(index),
                                          config={"gamma": 1.0, **config})
    assert torch.equal(adv, ret)
    assert torch.equal(adv * (1 - mask), torch.zeros_like(adv))   # nothing outside the response
    return adv[:, 0]


def test_grpo_passk_credits_only_the_best_sample_over_the_second():
    adv = _adv("grpo_passk", [1.0, 3.0, 2.0, 0.0, 0.0], ["a", "a", "a", "b", "b"])
    std_a = float(torch.tensor([1.0, 3.0, 2.0]).std())
    assert adv.tolist() == pytest.approx([0.0, 1.0 / (std_a + 1e-6), 0.0, 0.0, 0.0])
    adv = _adv("grpo_passk", [1.0, 3.0, 2.0], ["a", "a", "a"], norm_adv_by_std_in_grpo=False)
    assert adv.tolist() == pytest.approx([0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="at least 2 samples per group; group 'c' has 1"):
        _adv("grpo_passk", [1.0, 2.0, 5.0], ["a", "a", "c"])


def test_opo_subtracts_the_length_weighted_group_mean():
    # group a: scores 1 and 0 over 2 and 3 tokens: baseline (2·1 + 3·0) / 5 = 0.4; a singleton keeps its score
    adv = _adv("opo", [1.0, 0.0, 0.7], ["a", "a", "b"], lengths=[2, 3, 1])
    assert adv.tolist() == pytest.approx([0.6, -0.4, 0.7])


def test_gpg_scales_by_the_batch_share_of_non_zero_scores():
    # 2 of 4 scores non-zero: alpha = 4 / 2; group means 0.5 and 1
    adv = _adv("gpg", [1.0, 0.0, 2.0, 0.0], ["a", "a", "b", "b"])
    assert adv.tolist() == pytest.approx([1.0, -1.0, 2.0, -2.0])


def test_vectorised_estimators_differ_from_their_loops_only_where_verl_s_do():
    scores, index = [1.0, 3.0, 0.5, 2.0, 2.0], ["a", "a", "b", "c", "c"]
    assert _adv("grpo_vectorized", scores, index).tolist() == pytest.approx(_adv("grpo", scores, index).tolist())
    assert _adv("grpo_vectorized", scores, index, norm_adv_by_std_in_grpo=False).tolist() == pytest.approx(
        [-1.0, 1.0, 0.5, 0.0, 0.0])
    # rloo keeps a singleton's raw score; its vectorised form (as verl's) gives it 0
    assert _adv("rloo", scores, index).tolist() == pytest.approx([-2.0, 2.0, 0.5, 0.0, 0.0])
    assert _adv("rloo_vectorized", scores, index).tolist() == pytest.approx([-2.0, 2.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("name", ["grpo_passk", "opo", "gpg", "rloo_vectorized", "grpo_vectorized"])
def test_the_dispatcher_needs_the_groups(name):
    rewards, mask = _outcome([1.0, 0.0])
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask})
    with pytest.raises(ValueError, match="non_tensor_batch key 'uid'"):
        compute_advantage(data, name)


def _loss(name, log_ratio, adv, mask=None, **config):
    log_ratio = torch.tensor([log_ratio])
    old = torch.full_like(log_ratio, -1.0)
    log_prob = (old + log_ratio).requires_grad_()
    mask = torch.ones_like(log_ratio) if mask is None else torch.tensor([mask])
    loss, metrics = get_policy_loss_fn(name)(old, log_prob, torch.tensor([adv]), mask, "token-mean",
                                             {"clip_ratio": 0.2, **config})
    loss.backward()
    return loss.item(), log_prob.grad[0].tolist(), metrics


def test_sapo_gates_the_ratio_smoothly_with_each_sign_s_temperature():
    # at ratio 1 the gate is 4/tau · sigmoid(0) = 2/tau and its slope 1: the gradient is the plain PG gradient
    loss, grad, _ = _loss("sapo", [0.0, 0.0], [1.0, 1.0], tau_pos=2.0, tau_neg=3.0)
    assert loss == pytest.approx(-1.0)
    assert grad == pytest.approx([-0.5, -0.5])
    loss, grad, metrics = _loss("sapo", [0.0, math.log(2.0)], [-1.0, -1.0], tau_pos=2.0, tau_neg=3.0)
    gate = (4 / 3) * torch.sigmoid(torch.tensor(3.0 * (2.0 - 1.0))).item()
    assert loss == pytest.approx((2 / 3 + gate) / 2)
    slope = 4 * torch.sigmoid(torch.tensor(3.0)).item() * (1 - torch.sigmoid(torch.tensor(3.0)).item()) * 2.0
    assert grad == pytest.approx([0.5, slope / 2])
    assert float(metrics["actor/ppo_kl"]) == pytest.approx(-math.log(2.0) / 2)


def test_geo_mean_clips_each_token_on_the_binding_side_and_averages_in_log_space():
    # A > 0: log-ratios 0.1 and 0.3 with clip 0.2 bind at 0.1 and 0.2: ratio exp(0.15), loss -exp(0.15)
    loss, grad, metrics = _loss("geo_mean", [0.1, 0.3], [1.0, 1.0])
    assert loss == pytest.approx(-math.exp(0.15))
    assert grad == pytest.approx([-math.exp(0.15) / 2, 0.0])   # the clipped token has no gradient
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(0.5)
    # A < 0: a large ratio is not clipped (it makes the loss larger), a small one is: -0.3 binds at -0.2
    loss, _, metrics = _loss("geo_mean", [0.3, -0.3], [-1.0, -1.0])
    assert loss == pytest.approx(math.exp((0.3 - 0.2) / 2))
    assert float(metrics["actor/pg_clipfrac_lower"]) == pytest.approx(1.0)   # as verl: every token out of range
    # the masked token counts in neither the ratio nor the advantage
    loss, _, _ = _loss("geo_mean", [0.1, 5.0], [2.0, 9.0], mask=[1.0, 0.0])
    assert loss == pytest.approx(-2.0 * math.exp(0.1))


def test_agg_loss_multiplies_by_dp_size_even_with_local_counts():
    loss = torch.tensor([[1.0, 3.0], [5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert agg_loss(loss, mask, "token-mean", dp_size=2).item() == pytest.approx(2 * 3.0)
    assert agg_loss(loss, mask, "seq-mean-token-sum", dp_size=2).item() == pytest.approx(2 * 4.5)
    assert agg_loss(loss, mask, "seq-mean-token-mean", dp_size=2).item() == pytest.approx(2 * 3.5)


def test_kl_cov_falls_back_to_a_coefficient_of_one_for_an_explicit_null():
    old = torch.tensor([[-1.0, -1.0]])
    log_prob = old + torch.tensor([[0.5, 0.0]])
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)

    def loss(coef):
        return get_policy_loss_fn("kl_cov")(old, log_prob, adv, mask, "token-mean",
                                            {"policy_loss": {"kl_cov_ratio": 0.5, "ppo_kl_coef": coef}})[0].item()

    assert loss(None) == pytest.approx(loss(1.0)) and loss(None) != pytest.approx(loss(0.1))


def test_config_refuses_pass_at_k_without_groups_and_checks_sapo_temperatures():
    with pytest.raises(ConfigError, match="grpo_passk needs 'actor_rollout_ref.rollout.n' >= 2"):
        load_config(overrides=["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1"])
    with pytest.raises(ConfigError, match="tau_neg"):
        load_config(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
                               "actor_rollout_ref.actor.tau_neg=0"])
    cfg = load_config(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean", "algorithm.adv_estimator=opo",
                                 "actor_rollout_ref.rollout.n=2"])
    assert cfg.actor_rollout_ref.actor.tau_pos == 1.0 and cfg.actor_rollout_ref.actor.tau_neg == 1.05


def test_a_lower_clip_of_one_turns_the_lower_clip_off_and_plus_kl_types_are_accepted():
    loss, _, _ = _loss("vanilla", [-2.0], [1.0], clip_ratio_low=1.0, clip_ratio_high=0.2)
    assert loss == pytest.approx(-math.exp(-2.0))   # ratio e^-2 < 1 - 0.2 is not clipped up
    cfg = load_config(overrides=["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=k3+"])
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "k3+"


def test_rejection_sampling_reports_verl_s_spread_metrics():
    from hybridrl.algorithms.rollout_correction import rejection_mask

    log_ratio = torch.tensor([[0.0, 1.0], [2.0, 5.0]])   # k2 = lr²/2: [[0, 0.5], [2, -]]
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    _, m = rejection_mask(log_ratio, mask, "token_k2", 1.0)
    p = "rollout_rs_token_k2"
    assert m[f"{p}_seq_mean"] == pytest.approx((0.25 + 2.0) / 2)   # the rows' mean statistic
    assert (m[f"{p}_seq_max"], m[f"{p}_seq_min"], m[f"{p}_seq_fraction_high"]) == pytest.approx((2.0, 0.25, 0.5))
    assert m[f"{p}_std"] == pytest.approx(math.sqrt((0 + 0.25 + 1) / 3 - 0.25))   # clamped to [0, 1] first
    assert f"{p}_seq_fraction_low" not in m   # only k1 criteria have a lower bound
