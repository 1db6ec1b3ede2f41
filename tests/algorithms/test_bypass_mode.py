"""verl's bypass mode loss (algorithms/bypass_mode.py) against hand-written references on random inputs."""

import pytest
import torch

from hybridrl.algorithms import agg_loss, compute_policy_loss_vanilla
from hybridrl.algorithms.bypass_mode import BypassLoss, bypass_policy_loss
from hybridrl.algorithms.rollout_correction import kept_by_rejection, parse_rs_thresholds, rejection_mask

CFG = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}


def inputs(seed=0, rows=6, length=7):
    g = torch.Generator().manual_seed(seed)
    rollout = -2.0 + 0.5 * torch.randn(rows, length, generator=g)
    log_prob = (rollout + 0.3 * torch.randn(rows, length, generator=g)).requires_grad_()
    mask = torch.ones(rows, length)
    for i in range(rows):
        mask[i, length - i:] = 0   # row 0 full, the others shorter; padding holds garbage that must not count
    rollout = torch.where(mask.bool(), rollout, torch.tensor(float("nan")))
    return log_prob, rollout, torch.randn(rows, length, generator=g), mask


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_ppo_clip_without_rejection_is_the_vanilla_loss_against_the_rollouts_log_probs(mode):
    log_prob, rollout, adv, mask = inputs()
    loss, metrics = bypass_policy_loss(log_prob, rollout, adv, mask, mode, CFG, BypassLoss("ppo_clip"))
    ref, ref_metrics = compute_policy_loss_vanilla(rollout, log_prob, adv, mask, mode, CFG)
    torch.testing.assert_close(loss, ref)
    assert set(metrics) == set(ref_metrics)
    for key in metrics:
        torch.testing.assert_close(metrics[key], ref_metrics[key])
    assert torch.isfinite(torch.autograd.grad(loss, log_prob)[0]).all()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_rejected_tokens_add_nothing_and_still_count_in_the_normaliser(mode):
    log_prob, rollout, adv, mask = inputs(seed=1)
    settings = BypassLoss("ppo_clip", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25")
    loss, _ = bypass_policy_loss(log_prob, rollout, adv, mask, mode, CFG, settings)
    log_ratio = torch.where(mask.bool(), log_prob.detach() - rollout, 0.0)
    kept, _ = rejection_mask(log_ratio, mask, "token_k1", "0.8_1.25")
    assert 0 < kept.sum() < mask.sum()   # some rejected, some kept
    kept_mean, _ = compute_policy_loss_vanilla(rollout, log_prob, adv, kept, mode, CFG)
    if mode == "token-mean":
        expected = kept_mean * kept.sum() / mask.sum()
    else:   # the rows' means over their kept tokens, over every row that had tokens before rejection
        expected = kept_mean * (kept.sum(-1) > 0).sum() / (mask.sum(-1) > 0).sum()
    torch.testing.assert_close(loss, expected)


def test_the_loss_does_not_depend_on_the_micro_batch_split():
    """Each micro-batch's loss times its share of the tokens before rejection (the update's loss_scales) adds up to
    the whole batch's loss, with rejection and a sequence criterion that drops whole rows."""
    log_prob, rollout, adv, mask = inputs(seed=2, rows=8)
    settings = BypassLoss("reinforce", rollout_is="token", rollout_is_threshold=1.5, rollout_rs="seq_max_k2",
                          rollout_rs_threshold=0.05)
    th = settings.thresholds
    whole, _ = bypass_policy_loss(log_prob, rollout, adv, mask, "token-mean", CFG, settings)
    parts = torch.zeros(())
    for rows in (slice(0, 3), slice(3, 8)):
        part, _ = bypass_policy_loss(log_prob[rows], rollout[rows], adv[rows], mask[rows], "token-mean", CFG,
                                     settings)
        parts = parts + part * mask[rows].sum() / mask.sum()
    kept = kept_by_rejection(log_prob.detach() - rollout, mask, th)
    assert (kept.sum(-1) == 0).sum() > (mask.sum(-1) == 0).sum()   # whole rows were rejected
    torch.testing.assert_close(parts, whole)


@pytest.mark.parametrize("level", ["token", "sequence", None])
def test_reinforce_is_minus_weighted_advantage_times_log_prob(level):
    log_prob, rollout, adv, mask = inputs(seed=3)
    settings = BypassLoss("reinforce", rollout_is=level, rollout_is_threshold=1.3)
    loss, metrics = bypass_policy_loss(log_prob, rollout, adv, mask, "token-mean", CFG, settings)
    log_ratio = torch.where(mask.bool(), log_prob.detach() - rollout, 0.0)
    if level is None:
        w = torch.ones_like(mask)
    elif level == "token":
        w = log_ratio.exp().clamp(max=1.3)
    else:
        w = log_ratio.sum(-1, keepdim=True).exp().clamp(max=1.3).expand_as(mask)
    expected = -(w * adv * torch.where(mask.bool(), log_prob, 0.0) * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected)
    # the weights carry no gradient: d loss / d log_prob = -w * A / tokens
    grad = torch.autograd.grad(loss, log_prob)[0]
    torch.testing.assert_close(grad, -(w * adv * mask) / mask.sum())
    torch.testing.assert_close(metrics["actor/ppo_kl"], (-log_ratio * mask).sum() / mask.sum())


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_batch_normalised_weights_are_divided_by_their_mean_over_the_micro_batch(level):
    log_prob, rollout, adv, mask = inputs(seed=4)
    settings = BypassLoss("reinforce", rollout_is=level, rollout_is_threshold=5.0, rollout_is_batch_normalize=True)
    loss, _ = bypass_policy_loss(log_prob, rollout, adv, mask, "token-mean", CFG, settings)
    log_ratio = torch.where(mask.bool(), log_prob.detach() - rollout, 0.0)
    if level == "token":
        w = log_ratio.exp().clamp(max=5.0)
        w = w / ((w * mask).sum() / mask.sum())
    else:   # one weight per row: their mean over the rows is the divisor
        row_w = log_ratio.sum(-1).exp().clamp(max=5.0)
        w = (row_w / row_w.mean()).unsqueeze(-1).expand_as(mask)
    grad = torch.autograd.grad(loss, log_prob)[0]
    torch.testing.assert_close(grad, -(w * adv * mask) / mask.sum())


def test_seq_mean_token_sum_norm_keeps_its_constant():
    log_prob, rollout, adv, mask = inputs(seed=5)
    settings = BypassLoss("ppo_clip", rollout_rs="token_k2", rollout_rs_threshold=0.02)
    th = settings.thresholds
    loss, _ = bypass_policy_loss(log_prob, rollout, adv, mask, "seq-mean-token-sum-norm", CFG, settings)
    kept = kept_by_rejection(log_prob.detach() - rollout, mask, th)
    ref, _ = compute_policy_loss_vanilla(rollout, log_prob, adv, kept, "seq-mean-token-sum-norm", CFG)
    torch.testing.assert_close(loss, ref)
    assert agg_loss(torch.ones_like(mask), mask, "seq-mean-token-sum-norm") == mask.sum() / mask.shape[-1]


def test_settings_come_from_the_section_and_refuse_an_unknown_loss_type():
    s = BypassLoss.of({"loss_type": "reinforce", "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.99_1.01",
                       "bypass_mode": True})
    assert s.rollout_is is None and s.rollout_is_threshold == 2.0
    assert s.thresholds == parse_rs_thresholds("seq_mean_k1", "0.99_1.01")
    with pytest.raises(ValueError, match=r"loss_type='pg'.*\['ppo_clip', 'reinforce'\]"):
        BypassLoss("pg")
