"""The optimal token baseline estimators, Σπ² and the variance proxies against plain loop references."""

import numpy as np
import pytest
import torch

from hybridrl.algorithms import compute_advantage, get_adv_estimator_fn, sum_pi_squared_from_logits
from hybridrl.protocol import DataProto
from hybridrl.trainer.metrics import compute_variance_proxy_metrics
from hybridrl.training.fused_logprob import fused_sum_pi_squared


def batch(seed=0, rows=8, length=6, holes=False):
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 3, 5, 5, 2, 6, 4, 1][:rows]
    mask = torch.tensor([[1.0] * n + [0.0] * (length - n) for n in lengths])
    if holes:   # tool output inside the response: masked positions between response tokens
        mask[0, 2:4] = 0.0
        mask[5, 1] = 0.0
        mask[3] = 0.0   # a sample with no response tokens
    rewards = torch.zeros(rows, length)
    for i, n in enumerate(lengths):
        rewards[i, n - 1] = float(torch.randn(1, generator=g))
    rewards[2, 1] = 0.5   # a mid-response reward
    old = -torch.rand(rows, length, generator=g) * 3
    sumsq = torch.rand(rows, length, generator=g) * 0.5
    index = np.array(["a", "a", "a", "b", "b", "c", "d", "d"][:rows], dtype=object)
    return rewards, mask, index, old, sumsq


def reference(rewards, mask, index, old, sumsq, is_w=None, zero_tail=False, multi_turn=False, eps=1e-8):
    """The formula one sample, one position at a time; multi-turn positions count response tokens only."""
    rows = len(rewards)
    w = 1 - 2 * old.exp() + sumsq
    if is_w is not None:
        w = w * is_w**2
    toks = [torch.nonzero(mask[i]).flatten().tolist() for i in range(rows)]

    def seq(i):   # (G_k, W_k) at the k-th position of the sample (its response tokens in multi-turn)
        pos = toks[i] if multi_turn else list(range(mask.shape[1]))
        g = [sum(float(rewards[i, p] * mask[i, p]) for p in range(q, mask.shape[1])) for q in pos]
        wc = [sum(float(w[i, p] * mask[i, p]) for p in range(0, q + 1)) for q in pos]
        m = [float(mask[i, q]) for q in pos]
        return pos, g, wc, m

    adv = torch.zeros_like(rewards)
    for i in range(rows):
        group = [j for j in range(rows) if index[j] == index[i] and (not multi_turn or toks[j])]
        pos, g, wc, m = seq(i)
        lengths = sorted(len(toks[j]) for j in group)
        for k, q in enumerate(pos):
            base = 0.0
            if len(group) > 1:
                num = den = 0.0
                for j in group:
                    _, gj, wj, mj = seq(j)
                    if k < len(gj):
                        num += gj[k] * wj[k] * mj[k]
                        den += wj[k] * mj[k]
                base = num / (den + eps)
                longest = [j for j in group if len(toks[j]) == lengths[-1]]
                if zero_tail and len(longest) == 1 and lengths[-1] > lengths[-2] and longest[0] == i and \
                        k >= lengths[-2]:
                    base = 0.0
            adv[i, q] = (g[k] - base) * m[k]
    return adv * mask


@pytest.mark.parametrize("zero_tail", [False, True])
@pytest.mark.parametrize("with_is", [False, True])
def test_single_turn_baseline_matches_the_formula(zero_tail, with_is):
    rewards, mask, index, old, sumsq = batch()
    is_w = torch.rand(rewards.shape, generator=torch.Generator().manual_seed(9)) + 0.5 if with_is else None
    adv, ret = get_adv_estimator_fn("optimal_token_baseline")(
        token_level_rewards=rewards, response_mask=mask, index=index, old_log_probs=old, sum_pi_squared=sumsq,
        rollout_is_weights=is_w, handle_zero_tail=zero_tail)
    torch.testing.assert_close(adv, reference(rewards, mask, index, old, sumsq, is_w, zero_tail), atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(ret, (rewards * mask).flip(-1).cumsum(-1).flip(-1))
    assert torch.equal(adv[5], ret[5] * mask[5])   # a group of one keeps its reward-to-go


@pytest.mark.parametrize("zero_tail", [True, False])
def test_multi_turn_baseline_counts_response_tokens_only(zero_tail):
    rewards, mask, index, old, sumsq = batch(seed=1, holes=True)
    adv, _ = get_adv_estimator_fn("tir_optimal_token_baseline")(
        token_level_rewards=rewards, response_mask=mask, index=index, old_log_probs=old, sum_pi_squared=sumsq,
        handle_zero_tail=zero_tail)
    expected = reference(rewards, mask, index, old, sumsq, zero_tail=zero_tail, multi_turn=True)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    # row 4's group ('b') has one sample with tokens: no baseline; the single-turn form counts the empty row
    assert torch.allclose(adv[4], ((rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask)[4])
    single, _ = get_adv_estimator_fn("optimal_token_baseline")(
        token_level_rewards=rewards, response_mask=mask, index=index, old_log_probs=old, sum_pi_squared=sumsq)
    assert not torch.allclose(single[0], adv[0])   # the holes shift row 0's positions


def test_the_dispatcher_hands_over_the_old_log_probs_and_sum_pi_squared():
    rewards, mask, index, old, sumsq = batch(seed=2)
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": old},
                               non_tensors={"uid": index})
    with pytest.raises(ValueError, match="optimal_token_baseline.*'sum_pi_squared'"):
        compute_advantage(data, "optimal_token_baseline")
    data.batch["sum_pi_squared"] = sumsq
    compute_advantage(data, "optimal_token_baseline")
    torch.testing.assert_close(data.batch["advantages"], reference(rewards, mask, index, old, sumsq), atol=1e-5,
                               rtol=1e-5)


def test_sum_pi_squared_of_logits_and_of_the_fused_head():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(7, 50, generator=g) * 4
    logits[0, :40] = float("-inf")      # a masked vocabulary
    logits[1] += 1e4                    # large but equal shift: the same distribution
    expected = (torch.softmax(logits.double(), -1) ** 2).sum(-1).float()
    torch.testing.assert_close(sum_pi_squared_from_logits(logits, chunk_size=3), expected, atol=1e-6, rtol=1e-5)
    one_hot = torch.full((1, 50), -1e9)
    one_hot[0, 7] = 0.0
    assert sum_pi_squared_from_logits(one_hot).item() == pytest.approx(1.0)
    assert sum_pi_squared_from_logits(torch.zeros(1, 50)).item() == pytest.approx(1 / 50)
    hidden, weight = torch.randn(9, 16, generator=g), torch.randn(50, 16, generator=g)
    torch.testing.assert_close(fused_sum_pi_squared(hidden, weight, 0.7),
                               (torch.softmax((hidden @ weight.T) / 0.7, -1) ** 2).sum(-1), atol=1e-6, rtol=1e-5)


def test_variance_proxies_follow_their_formulas():
    rewards, mask, index, old, sumsq = batch(seed=4)
    adv = torch.randn(rewards.shape, generator=torch.Generator().manual_seed(5)) * mask
    data = DataProto.from_dict({"response_mask": mask, "old_log_probs": old, "sum_pi_squared": sumsq,
                                "advantages": adv})
    m = compute_variance_proxy_metrics(data, gradient_norm=0.5)
    a_bar = (adv * mask).sum(-1) / mask.sum(-1)
    w = ((1 - 2 * old.exp() + sumsq) * mask).sum(-1)
    power = (a_bar**2 * w.clamp(min=0)).mean().item()
    assert m["variance_proxy/proxy2_total_power"] == pytest.approx(power, rel=1e-5)
    assert m["variance_proxy/proxy1_signal_strength"] == pytest.approx(0.25)
    assert m["variance_proxy/proxy3_pure_noise"] == pytest.approx(max(0.0, (power - 0.25) / 7), rel=1e-5, abs=1e-9)
    assert m["variance_proxy/expected_w"] == pytest.approx(w.mean().item(), rel=1e-5)
    assert compute_variance_proxy_metrics(DataProto.from_dict({"response_mask": mask, "advantages": adv})) == {}


def test_the_config_asks_for_sum_pi_squared_and_the_plan_runs_the_old_pass():
    from transformers import Qwen2Config

    from hybridrl.config.errors import ConfigError
    from hybridrl.config.loader import load_config
    from hybridrl.plan import DeviceSpec, make_plan

    otb, sq = "algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=true"
    with pytest.raises(ConfigError, match="needs 'actor_rollout_ref.actor.calculate_sum_pi_squared' = true"):
        load_config(overrides=[otb])
    with pytest.raises(ConfigError, match="bypass_mode' = true skips"):
        load_config(overrides=[otb, sq, "algorithm.rollout_correction.bypass_mode=true"])
    with pytest.raises(ConfigError, match="calculate_sum_pi_squared' = true needs the old-log-prob pass.*= false"):
        load_config(overrides=[sq, "actor_rollout_ref.actor.old_log_prob_pass=false"])
    hf = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=256)
    plan = make_plan(load_config(overrides=[otb, sq]), hf, DeviceSpec("cpu", "cpu", None))
    assert plan.actor.old_log_prob_pass   # one on-policy mini-batch, but Σπ² comes from that pass
    assert any("rollout.n" in w for w in load_config(overrides=[otb, sq, "actor_rollout_ref.rollout.n=1"]).validate())
