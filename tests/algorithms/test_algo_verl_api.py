"""verl's keyword signatures, registries and the extra policy-loss modes, each against a hand-computed value."""

import math

import numpy as np
import pytest
import torch

from hybridrl.algorithms import (
    FixedKLController,
    agg_loss,
    compute_advantage,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    get_kl_controller,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)
from hybridrl.algorithms.registry import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from hybridrl.protocol import DataProto

CONFIG = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_verl_keyword_calls():
    rewards, mask = _t([[0, 1.0], [0, 3.0]]), _t([[1, 1], [1, 1]])
    adv, _ = compute_grpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask, index=np.array(["a", "a"]),
                                            epsilon=1e-6, norm_adv_by_std_in_grpo=False, config=None)
    assert adv[:, 0].tolist() == [-1.0, 1.0]  # scores 1 and 3, group mean 2
    adv, _ = compute_rloo_outcome_advantage(token_level_rewards=rewards, response_mask=mask,
                                            index=np.array(["a", "a"]), config={"gamma": 1.0})
    assert adv[:, 0].tolist() == [-2.0, 2.0]  # score minus the other sample's score
    _, returns = compute_reinforce_plus_plus_outcome_advantage(token_level_rewards=rewards, response_mask=mask,
                                                               config={"gamma": 0.5})
    assert returns[1].tolist() == [1.5, 3.0]  # gamma read from config, as verl does
    with pytest.raises(TypeError, match="pass the discount as gamma="):
        compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.5)
    assert isinstance(get_kl_controller(kl_ctrl={"type": "fixed", "kl_coef": 0.1}), FixedKLController)
    loss = agg_loss(loss_mat=_t([[1, 2], [3, 4]]), loss_mask=_t([[1, 1], [1, 0]]), loss_agg_mode="token-mean",
                    dp_size=2, batch_num_tokens=12, global_batch_size=None, loss_scale_factor=None)
    assert loss.item() == pytest.approx(6 / 12 * 2)  # global token count, times dp_size (verl's FSDP scaling)
    assert agg_loss(_t([[1, 2], [3, 4]]), _t([[1, 1], [1, 0]]), "seq-mean-token-sum", dp_size=2,
                    global_batch_size=4).item() == pytest.approx((3 + 3) / 4 * 2)
    assert agg_loss(_t([[1, 2], [3, 4]]), _t([[1, 1], [1, 0]]), "seq-mean-token-sum-norm",
                    loss_scale_factor=3).item() == pytest.approx(6 / 3)


def _batch(**extra_tensors):
    data = DataProto.from_dict(tensors={"token_level_rewards": _t([[0, 1.0], [0, 3.0]]),
                                        "response_mask": _t([[1, 1], [1, 0]]), **extra_tensors})
    data.non_tensor_batch["uid"] = np.array(["a", "a"], dtype=object)
    return data


def test_registered_estimator_is_used_by_compute_advantage():
    @register_adv_est("test_constant")
    def constant(token_level_rewards, response_mask, config=None, index=None, **kwargs):
        value = config["gamma"] * 10
        return response_mask * value, response_mask * value

    try:
        out = compute_advantage(data=_batch(), adv_estimator="test_constant", gamma=0.3, lam=1.0, num_repeat=1,
                                norm_adv_by_std_in_grpo=True, config=None)
        assert out.batch["advantages"].tolist() == [[3.0, 3.0], [3.0, 0.0]]
        assert get_adv_estimator_fn("test_constant") is constant
        with pytest.raises(ValueError, match="'test_constant' is already registered"):
            register_adv_est("test_constant")(lambda **kw: None)
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("test_constant")
    with pytest.raises(ValueError, match="adv_estimator='nope'.*grpo"):
        get_adv_estimator_fn("nope")
    gamma_from_config = compute_advantage(_batch(), "reinforce_plus_plus", gamma=0.0, config={"gamma": 1.0})
    assert gamma_from_config.batch["returns"][0].tolist() == [1.0, 1.0]


def test_registered_policy_loss_and_unknown_name():
    @register_policy_loss("test_zero")
    def zero(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
        return (log_prob * 0).sum(), {}

    try:
        assert get_policy_loss_fn("test_zero") is zero
    finally:
        POLICY_LOSS_REGISTRY.pop("test_zero")
    with pytest.raises(ValueError, match="loss_mode='nope'.*cispo.*gspo"):
        get_policy_loss_fn("nope")


def _run(mode, old, new, adv, mask, config=CONFIG, **kw):
    log_prob = _t(new).requires_grad_(True)
    loss, metrics = get_policy_loss_fn(mode)(_t(old), log_prob, _t(adv), _t(mask), config=config, **kw)
    loss.backward()
    return loss.item(), metrics, log_prob.grad.tolist()


def test_vanilla_with_rollout_weights():
    # ratios e^0.1 (inside the clip range) and e^0.5 (clipped at 1.28 for A > 0); weights 2 and 1
    loss, metrics, grad = _run("vanilla", [[-1, -1]], [[-0.9, -0.5]], [[1, 1]], [[1, 1]],
                               rollout_is_weights=_t([[2, 1]]))
    assert loss == pytest.approx((-2 * math.exp(0.1) - 1.28) / 2, rel=1e-6)
    assert metrics == pytest.approx({"actor/pg_clipfrac": 0.5, "actor/ppo_kl": -0.3, "actor/pg_clipfrac_lower": 0.0})
    assert grad[0] == pytest.approx([-math.exp(0.1), 0.0], rel=1e-6)


def test_gspo_uses_one_ratio_per_sequence():
    # sequence ratio exp(mean(0.1, 0.3)) = e^0.2, unclipped: loss -e^0.2, each token's gradient -e^0.2 / 2
    loss, metrics, grad = _run("gspo", [[-1, -1, -1]], [[-0.9, -0.7, 5.0]], [[1, 1, 1]], [[1, 1, 0]],
                               loss_agg_mode="token-mean")
    assert loss == pytest.approx(-math.exp(0.2), rel=1e-6)
    assert grad[0] == pytest.approx([-math.exp(0.2) / 2, -math.exp(0.2) / 2, 0.0], rel=1e-6)
    # sequence ratio e^0.5 is clipped at 1.28: constant loss, no gradient
    loss, metrics, grad = _run("gspo", [[-1, -1]], [[-0.6, -0.4]], [[1, 1]], [[1, 1]])
    assert loss == pytest.approx(-1.28) and grad[0] == [0.0, 0.0] and metrics["actor/pg_clipfrac"] == 1.0


def test_gpg_is_minus_advantage_times_log_prob():
    loss, metrics, grad = _run("gpg", [[0, 0]], [[-1, -2]], [[1, 0.5]], [[1, 1]])
    assert (loss, metrics) == (pytest.approx(1.0), {})  # (1*1 + 2*0.5) / 2
    assert grad[0] == pytest.approx([-0.5, -0.25])


def test_cispo_clips_a_stopped_weight():
    # ratios e^0.5 -> clipped to 1.28, and 1; loss -sg(w) * A * log π averaged over 2 tokens
    loss, metrics, grad = _run("cispo", [[-1, -1]], [[-0.5, -1.0]], [[1, 1]], [[1, 1]])
    assert loss == pytest.approx((1.28 * 0.5 + 1.0) / 2)
    assert grad[0] == pytest.approx([-1.28 / 2, -0.5])
    assert metrics["actor/pg_clipfrac"] == 0.5


def test_kl_cov_penalises_the_top_covariance_token():
    old, new, adv = [[-1, -1, -1, -1]], [[-0.5, -1.5, -2.0, -1.0]], [[2, -1, 1, 0]]
    mean_a, mean_lp = sum(adv[0]) / 4, sum(new[0]) / 4
    cov = [(a - mean_a) * (lp - mean_lp) for a, lp in zip(adv[0], new[0])]
    top = max(range(4), key=lambda i: cov[i])  # kl_cov_ratio 0.25 of 4 tokens: one token
    config = {**CONFIG, "policy_loss": {"kl_cov_ratio": 0.25, "ppo_kl_coef": 0.5}}
    loss, metrics, _ = _run("kl_cov", old, new, adv, [[1, 1, 1, 1]], config=config)
    log_ratios = [n - o for n, o in zip(new[0], old[0])]
    per_token = [-a * math.exp(r) + (0.5 * abs(r) if i == top else 0.0)
                 for i, (a, r) in enumerate(zip(adv[0], log_ratios))]
    assert loss == pytest.approx(sum(per_token) / 4, rel=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(sum(abs(r) for r in log_ratios) / 4)


def test_clip_cov_detaches_tokens_in_the_covariance_band():
    old, new, adv = [[-1, -1, -1, -1]], [[-1, -1.2, -0.8, -1]], [[3, -1, -1, -1]]
    mean_a, mean_lp = 0.0, -1.0
    cov = [(a - mean_a) * (lp - mean_lp) for a, lp in zip(adv[0], new[0])]  # [0, 0.2, -0.2, 0]
    config = {**CONFIG, "policy_loss": {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.1, "clip_cov_ub": 1.0}}
    loss, metrics, grad = _run("clip_cov", old, new, adv, [[1, 1, 1, 1]], config=config)
    assert [0.1 < c < 1.0 for c in cov] == [False, True, False, False]
    kept = [-a * math.exp(n - o) for a, n, o in zip(adv[0], new[0], old[0])]
    kept[1] = 0.0  # the one token in the band loses its loss and gradient
    assert loss == pytest.approx(sum(kept) / 4, rel=1e-6)
    assert grad[0][1] == 0.0 and grad[0][0] == pytest.approx(-3 / 4)
    assert metrics["actor/pg_clipfrac"] == 0.25


def test_modes_that_need_a_config_say_so():
    for mode in ("vanilla", "gspo", "clip_cov", "kl_cov", "cispo"):
        with pytest.raises(ValueError, match=f"policy loss '{mode}': config"):
            get_policy_loss_fn(mode)(_t([[0]]), _t([[0]]), _t([[1]]), _t([[1]]))
    with pytest.raises(ValueError, match="clip_cov_ratio=0.0 must be > 0"):
        _run("clip_cov", [[0]], [[0]], [[1]], [[1]], config={**CONFIG, "policy_loss": {"clip_cov_ratio": 0.0}})
