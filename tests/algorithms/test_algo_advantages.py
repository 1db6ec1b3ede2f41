"""Every advantage estimator against an independent plain-Python reference on small uneven batches."""

import math
import statistics

import numpy as np
import pytest
import torch

from hybridrl.algorithms import (
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from hybridrl.protocol import DataProto

# 5 responses of lengths 4, 2, 3, 1, 4 (R = 4); outcome reward on the last token; groups a a a | b b ... c
LENGTHS = [4, 2, 3, 1, 4]
SCORES = [1.0, 0.0, 0.5, 2.0, -1.0]
UIDS = np.array(["a", "a", "a", "b", "c"], dtype=object)  # b and c are singletons
R = 4


def _mask():
    return [[1 if t < n else 0 for t in range(R)] for n in LENGTHS]


def _outcome_rewards():
    return [[SCORES[i] if t == n - 1 else 0.0 for t in range(R)] for i, n in enumerate(LENGTHS)]


def _whiten_ref(rows, mask):
    xs = [v for vr, mr in zip(rows, mask) for v, m in zip(vr, mr) if m]
    mean, std = statistics.mean(xs), statistics.stdev(xs)
    return [[(v - mean) / math.sqrt(std**2 + 1e-8) for v in vr] for vr in rows]


def _close(tensor, expected, tol=1e-5):
    assert tensor.shape == (len(expected), len(expected[0]))
    for got_row, exp_row in zip(tensor.tolist(), expected):
        assert got_row == pytest.approx(exp_row, abs=tol, rel=tol)


def _group_scores(uids, scores):
    groups = {}
    for u, s in zip(uids, scores):
        groups.setdefault(u, []).append(s)
    return groups


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8)])
def test_gae_matches_reversed_loop(gamma, lam):
    rewards = [[0.1, -0.2, 0.0, 0.3], [0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.2, 0.0]]
    values = [[0.2, 0.4, -0.1, 0.3], [0.1, 0.6, 9.0, 9.0], [0.3, 7.0, 0.1, 7.0]]
    mask = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]]  # row 2 has a hole (observation token) inside
    expected_adv = []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        adv, next_value, last = [0.0] * R, 0.0, 0.0
        for t in reversed(range(R)):
            if m_row[t]:
                last = r_row[t] + gamma * next_value - v_row[t] + gamma * lam * last
                next_value = v_row[t]
            adv[t] = last
        expected_adv.append(adv)
    expected_ret = [[a + v for a, v in zip(ar, vr)] for ar, vr in zip(expected_adv, values)]
    adv, ret = compute_gae_advantage_return(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask),
                                            gamma=gamma, lam=lam)
    _close(ret, expected_ret)
    _close(adv, _whiten_ref(expected_adv, mask))


def test_gae_lambda_one_returns_are_monte_carlo():
    gamma = 0.7
    rewards = [[0.1, -0.2, 0.0, 0.3], [0.0, 1.0, 0.0, 0.0]]
    values = [[5.0, -3.0, 2.0, 1.0], [4.0, 0.6, 0.0, 0.0]]
    mask = [[1, 1, 1, 1], [1, 1, 0, 0]]
    _, ret = compute_gae_advantage_return(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask),
                                          gamma=gamma, lam=1.0)
    for i, row in enumerate(rewards):
        for t in range(sum(mask[i])):  # with lam = 1 the values cancel: return = discounted reward-to-go
            mc = sum(gamma ** (k - t) * row[k] for k in range(t, sum(mask[i])))
            assert ret[i, t].item() == pytest.approx(mc, abs=1e-5)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_group_norm_and_singletons(norm):
    eps = 1e-6
    groups = _group_scores(UIDS, SCORES)
    expected = []
    for i, uid in enumerate(UIDS):
        g = groups[uid]
        mean, std = (statistics.mean(g), statistics.stdev(g)) if len(g) > 1 else (0.0, 1.0)
        a = (SCORES[i] - mean) / (std + eps) if norm else SCORES[i] - mean
        expected.append([a * m for m in _mask()[i]])
    adv, ret = compute_grpo_outcome_advantage(torch.tensor(_outcome_rewards()), torch.tensor(_mask()), UIDS,
                                              epsilon=eps, norm_adv_by_std_in_grpo=norm)
    _close(adv, expected)
    assert torch.equal(adv, ret)
    assert adv[3, 0].item() == pytest.approx(2.0 / (1 + eps) if norm else 2.0)  # singleton: raw score


def test_grpo_groups_need_not_be_adjacent_and_equal_scores_give_zero():
    uids = np.array(["x", "y", "x", "y"], dtype=object)
    rewards = torch.tensor([[1.0], [3.0], [1.0], [5.0]])
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(4, 1), uids)
    y_std = statistics.stdev([3.0, 5.0])
    assert adv.flatten().tolist() == pytest.approx([0.0, -1.0 / (y_std + 1e-6), 0.0, 1.0 / (y_std + 1e-6)])


def test_grpo_index_length_mismatch_raises():
    with pytest.raises(ValueError, match="index"):
        compute_grpo_outcome_advantage(torch.zeros(3, 2), torch.ones(3, 2), UIDS)


def test_rloo_leave_one_out():
    groups = _group_scores(UIDS, SCORES)
    expected = []
    for i, uid in enumerate(UIDS):
        g = groups[uid]
        a = SCORES[i] - (sum(g) - SCORES[i]) / (len(g) - 1) if len(g) > 1 else SCORES[i]
        expected.append([a * m for m in _mask()[i]])
    adv, ret = compute_rloo_outcome_advantage(torch.tensor(_outcome_rewards()), torch.tensor(_mask()), UIDS)
    _close(adv, expected)
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_discounted_and_reset():
    gamma = 0.5
    rewards = [[0.0, 0.0, 1.0, 4.0], [0.5, 2.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    expected_ret = []
    for r_row, m_row in zip(rewards, mask):
        ret_row, running = [0.0] * R, 0.0
        for t in reversed(range(R)):
            running = r_row[t] + gamma * running
            ret_row[t] = running
            if not m_row[t]:
                running = 0.0
        expected_ret.append(ret_row)
    white = _whiten_ref(expected_ret, mask)
    expected_adv = [[w * m for w, m in zip(wr, mr)] for wr, mr in zip(white, mask)]
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(torch.tensor(rewards), torch.tensor(mask), gamma=gamma)
    _close(ret, expected_ret)
    _close(adv, expected_adv)
    assert ret[0, 2].item() == pytest.approx(1.0)  # the reward after eos (4.0) does not leak back


def test_reinforce_plus_plus_baseline():
    groups = _group_scores(UIDS, SCORES)
    centred = []
    for i, uid in enumerate(UIDS):
        g = groups[uid]
        base = statistics.mean(g) if len(g) > 1 else 0.0
        centred.append([(SCORES[i] - base) * m for m in _mask()[i]])
    white = _whiten_ref(centred, _mask())
    expected = [[w * m for w, m in zip(wr, mr)] for wr, mr in zip(white, _mask())]
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(
        torch.tensor(_outcome_rewards()), torch.tensor(_mask()), UIDS)
    _close(adv, expected)
    assert torch.equal(adv, ret)


def test_remax_reverse_cumsum_minus_baseline():
    rewards = [[0.1, 0.0, 1.0, 7.0], [0.0, 2.0, 5.0, 0.0]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0]]
    baselines = [0.3, 1.5]
    exp_ret = [[sum(r[k] * m[k] for k in range(t, R)) for t in range(R)] for r, m in zip(rewards, mask)]
    exp_adv = [[exp_ret[i][t] - baselines[i] * mask[i][t] for t in range(R)] for i in range(2)]
    adv, ret = compute_remax_outcome_advantage(torch.tensor(rewards), torch.tensor(baselines), torch.tensor(mask))
    _close(ret, exp_ret)
    _close(adv, exp_adv)


def _batch(**extra):
    tensors = {"token_level_rewards": torch.tensor(_outcome_rewards()), "response_mask": torch.tensor(_mask())}
    tensors.update(extra)
    return DataProto.from_dict(tensors, {"uid": UIDS})


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_compute_advantage_dispatch_matches_direct_call(name):
    data = compute_advantage(_batch(), name, gamma=0.9, norm_adv_by_std_in_grpo=False)
    rewards, mask = torch.tensor(_outcome_rewards()), torch.tensor(_mask())
    direct = {
        "grpo": lambda: compute_grpo_outcome_advantage(rewards, mask, UIDS, norm_adv_by_std_in_grpo=False),
        "rloo": lambda: compute_rloo_outcome_advantage(rewards, mask, UIDS),
        "reinforce_plus_plus": lambda: compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9),
        "reinforce_plus_plus_baseline": lambda: compute_reinforce_plus_plus_baseline_outcome_advantage(
            rewards, mask, UIDS),
    }[name]()
    assert torch.equal(data.batch["advantages"], direct[0])
    assert torch.equal(data.batch["returns"], direct[1])


def test_compute_advantage_gae_remax_and_derived_mask():
    values = torch.full((5, R), 0.25)
    data = compute_advantage(_batch(values=values), "gae", gamma=1.0, lam=1.0)
    _, ret = compute_gae_advantage_return(torch.tensor(_outcome_rewards()), values, torch.tensor(_mask()), 1.0, 1.0)
    assert torch.equal(data.batch["returns"], ret)

    prompts_mask = torch.ones(5, 2, dtype=torch.long)
    no_mask = DataProto.from_dict({"token_level_rewards": torch.tensor(_outcome_rewards()),
                                   "responses": torch.zeros(5, R, dtype=torch.long),
                                   "attention_mask": torch.cat([prompts_mask, torch.tensor(_mask())], dim=1),
                                   "reward_baselines": torch.tensor(SCORES)}, {"uid": UIDS})
    out = compute_advantage(no_mask, "remax")
    assert torch.equal(out.batch["response_mask"], torch.tensor(_mask()))
    # remax with baseline = own score: advantage is 0 at every token up to (and including) the reward
    assert out.batch["advantages"].abs().max().item() == 0.0


def test_compute_advantage_errors_name_the_problem():
    with pytest.raises(ValueError, match="adv_estimator=.*valid:.*grpo"):
        compute_advantage(_batch(), "ppo_magic")
    with pytest.raises(ValueError, match="'values'"):
        compute_advantage(_batch(), "gae")
    with pytest.raises(ValueError, match="'reward_baselines'"):
        compute_advantage(_batch(), "remax")
    no_uid = DataProto.from_dict({"token_level_rewards": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="'uid'"):
        compute_advantage(no_uid, "grpo")


def test_bf16_rewards_are_upcast():
    rewards = torch.tensor(_outcome_rewards()).to(torch.bfloat16)
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.tensor(_mask()), UIDS)
    assert adv.dtype == torch.float32
