"""KL estimators vs their formulas, controllers, get_kl_controller and apply_kl_penalty vs a loop."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from hybridrl.protocol import DataProto

LOGP = [[-1.0, -0.5, -2.0], [-0.1, -3.0, -0.7]]
REF = [[-1.2, -0.5, -1.0], [-0.4, -2.5, -0.7]]


def _formula(name, lp, ref):
    x = lp - ref
    if name in ("kl", "k1"):
        return x
    if name == "abs":
        return abs(x)
    if name in ("mse", "k2"):
        return 0.5 * x * x
    r = max(-20.0, min(20.0, ref - lp))  # low_var_kl / k3
    return max(-10.0, min(10.0, math.exp(r) - r - 1))


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_estimators_match_formulas(name):
    got = kl_penalty(torch.tensor(LOGP), torch.tensor(REF), name)
    expected = [[_formula(name, lp, rf) for lp, rf in zip(lr, rr)] for lr, rr in zip(LOGP, REF)]
    for got_row, exp_row in zip(got.tolist(), expected):
        assert got_row == pytest.approx(exp_row, rel=1e-6, abs=1e-7)


def test_low_var_kl_is_clamped_and_nonnegative():
    got = kl_penalty(torch.tensor([[-30.0, 0.0, 0.0]]), torch.tensor([[0.0, -30.0, -3.0]]), "low_var_kl")
    assert got[0, 0].item() == 10.0  # exp(20) - 21 clamped to 10
    assert got[0, 1].item() == 10.0  # exp(-20) + 19 clamped to 10
    assert got[0, 2].item() == pytest.approx(math.exp(-3) + 3 - 1, rel=1e-6)  # inside the clamp
    assert (kl_penalty(torch.tensor(LOGP), torch.tensor(REF), "k3") >= 0).all()


def test_plus_suffix_keeps_value_and_uses_k2_gradient():
    logp = torch.tensor(LOGP, requires_grad=True)
    out = kl_penalty(logp, torch.tensor(REF), "k3+")
    assert torch.equal(out.detach(), kl_penalty(torch.tensor(LOGP), torch.tensor(REF), "k3"))
    out.sum().backward()
    expected_grad = [[lp - rf for lp, rf in zip(lr, rr)] for lr, rr in zip(LOGP, REF)]  # d(0.5 x^2)/dx
    for got_row, exp_row in zip(logp.grad.tolist(), expected_grad):
        assert got_row == pytest.approx(exp_row, rel=1e-6, abs=1e-7)


def test_bad_estimator_names_raise():
    t = torch.zeros(1, 2)
    with pytest.raises(NotImplementedError, match="full"):
        kl_penalty(t, t, "full")
    with pytest.raises(ValueError, match="kl_penalty='k4'.*low_var_kl"):
        kl_penalty(t, t, "k4")


def test_adaptive_controller_moves_towards_target():
    up = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    up.update(current_kl=1.0, n_steps=10)  # error clipped to +0.2
    assert up.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 1000))
    down = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    down.update(current_kl=0.04, n_steps=10)  # error -0.2 exactly
    assert down.value == pytest.approx(0.1 * (1 - 0.2 * 10 / 1000))
    small = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    small.update(current_kl=0.055, n_steps=10)  # error +0.1, inside the clip
    assert small.value == pytest.approx(0.1 * (1 + 0.1 * 10 / 1000))
    fixed = FixedKLController(0.1)
    fixed.update(current_kl=5.0, n_steps=10)
    assert fixed.value == 0.1


def test_get_kl_controller_from_config_and_errors():
    cfg = OmegaConf.create({"type": "adaptive", "kl_coef": 0.2, "horizon": 100, "target_kl": 0.1})
    ctrl = get_kl_controller(cfg)
    assert isinstance(ctrl, AdaptiveKLController) and (ctrl.value, ctrl.target, ctrl.horizon) == (0.2, 0.1, 100)
    assert isinstance(get_kl_controller({"type": "fixed", "kl_coef": 0.01}), FixedKLController)
    with pytest.raises(ValueError, match="kl_ctrl.type='pid'"):
        get_kl_controller({"type": "pid", "kl_coef": 0.01})
    with pytest.raises(ValueError, match="horizon=0"):
        get_kl_controller({"type": "adaptive", "kl_coef": 0.01, "horizon": 0, "target_kl": 0.1})


def test_apply_kl_penalty_matches_loop_and_updates_controller():
    scores = [[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    beta = 0.5
    data = DataProto.from_dict({"token_level_scores": torch.tensor(scores), "old_log_probs": torch.tensor(LOGP),
                                "ref_log_prob": torch.tensor(REF), "response_mask": torch.tensor(mask)})
    ctrl = AdaptiveKLController(init_kl_coef=beta, target_kl=0.01, horizon=100)
    data, metrics = apply_kl_penalty(data, ctrl, kl_penalty="kl")
    per_seq = []
    for i in range(2):
        kls = [(LOGP[i][t] - REF[i][t]) * mask[i][t] for t in range(3)]
        expected = [scores[i][t] - beta * kls[t] for t in range(3)]
        assert data.batch["token_level_rewards"][i].tolist() == pytest.approx(expected, rel=1e-6)
        per_seq.append(sum(kls) / sum(mask[i]))
    batch_kl = sum(per_seq) / 2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(batch_kl, rel=1e-6)
    assert metrics["actor/reward_kl_penalty_coeff"] == beta
    err = max(-0.2, min(0.2, batch_kl / 0.01 - 1))
    assert ctrl.value == pytest.approx(beta * (1 + err * 2 / 100))


def test_apply_kl_penalty_missing_ref_raises():
    data = DataProto.from_dict({"token_level_scores": torch.zeros(1, 2), "old_log_probs": torch.zeros(1, 2),
                                "response_mask": torch.ones(1, 2)})
    with pytest.raises(ValueError, match="ref_log_prob"):
        apply_kl_penalty(data, FixedKLController(0.1))
