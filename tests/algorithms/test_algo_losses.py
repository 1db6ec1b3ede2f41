"""agg_loss modes, PPO policy loss (clip-higher, dual-clip), entropy and value losses vs plain-Python loops."""

import math

import pytest
import torch

from hybridrl.algorithms import agg_loss, compute_entropy_loss, compute_policy_loss, compute_value_loss

LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 8.0, 9.0, 10.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]  # row 2 fully masked


def _agg_ref(loss, mask, mode):
    R = len(loss[0])
    sums = [sum(v * m for v, m in zip(lr, mr)) for lr, mr in zip(loss, mask)]
    counts = [sum(mr) for mr in mask]
    nonempty = [i for i, c in enumerate(counts) if c > 0]
    if mode == "token-mean":
        return sum(sums) / sum(counts)
    if mode == "seq-mean-token-sum":
        return sum(sums[i] for i in nonempty) / len(nonempty)
    if mode == "seq-mean-token-mean":
        return sum(sums[i] / counts[i] for i in nonempty) / len(nonempty)
    return sum(sums) / R  # seq-mean-token-sum-norm


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_agg_loss_modes(mode):
    got = agg_loss(torch.tensor(LOSS), torch.tensor(MASK), mode)
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(_agg_ref(LOSS, MASK, mode), rel=1e-6)


def test_agg_loss_modes_differ_and_bad_name_raises():
    values = {m: agg_loss(torch.tensor(LOSS), torch.tensor(MASK), m).item()
              for m in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]}
    assert len(set(values.values())) == 4
    with pytest.raises(ValueError, match="loss_agg_mode.*token-mean"):
        agg_loss(torch.tensor(LOSS), torch.tensor(MASK), "token-sum")


def _pg_ref(old, new, adv, mask, lo, hi, c):
    losses, clipped, lower = [], [], []
    for o_row, n_row, a_row in zip(old, new, adv):
        for o, n, a in zip(o_row, n_row, a_row):
            ratio = math.exp(max(-20.0, min(20.0, n - o)))
            l1, l2 = -a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi)
            c1 = max(l1, l2)
            loss, low = c1, 0.0
            if a < 0:
                loss = min(-a * c, c1)
                low = float(c1 > -a * c)
            losses.append(loss)
            clipped.append(float(l2 > l1))
            lower.append(low)
    flat_mask = [m for row in mask for m in row]
    n = sum(flat_mask)
    mean = lambda xs: sum(x * m for x, m in zip(xs, flat_mask)) / n  # noqa: E731
    kl = [o - nw for o_row, n_row in zip(old, new) for o, nw in zip(o_row, n_row)]
    return mean(losses), mean(clipped), mean(kl), mean(lower)


def _pg_case():
    # ratios: 1.25 (A>0), 0.75 (A<0), 5.0 (A<0: dual-clip), 1.1 (A>0), 0.5 (A>0), masked token
    ratios = [[1.25, 0.75, 5.0], [1.1, 0.5, 3.0]]
    adv = [[1.0, -2.0, -1.5], [0.5, 2.0, 9.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    old = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.0]]
    new = [[o + math.log(r) for o, r in zip(orow, rrow)] for orow, rrow in zip(old, ratios)]
    return old, new, adv, mask


@pytest.mark.parametrize("lo,hi", [(0.2, 0.2), (0.2, 0.28), (0.3, 0.2)])
def test_policy_loss_matches_reference(lo, hi):
    old, new, adv, mask = _pg_case()
    got = compute_policy_loss(torch.tensor(old), torch.tensor(new), torch.tensor(adv), torch.tensor(mask),
                              cliprange=0.2, cliprange_low=lo, cliprange_high=hi, clip_ratio_c=3.0)
    for g, e in zip(got, _pg_ref(old, new, adv, mask, lo, hi, 3.0)):
        assert g.item() == pytest.approx(e, rel=1e-5, abs=1e-6)


def test_clip_higher_is_asymmetric():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(1.25), math.log(0.75)]])
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    sym = compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    high = compute_policy_loss(old, new, adv, mask, cliprange=0.2, cliprange_high=0.28)
    low_wide = compute_policy_loss(old, new, adv, mask, cliprange=0.2, cliprange_low=0.3)
    assert sym[1].item() == pytest.approx(1.0)  # both tokens clipped at ±0.2
    assert high[1].item() == pytest.approx(0.5)  # 1.25 < 1.28: the positive token is free, the negative still clipped
    assert low_wide[1].item() == pytest.approx(0.5)  # 0.75 > 0.7: the negative token is free
    assert high[0].item() == pytest.approx((-1.25 + 0.8) / 2, rel=1e-6)


def test_dual_clip_caps_negative_advantage_and_stops_its_gradient():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(5.0), math.log(1.1)]], requires_grad=True)
    adv = torch.tensor([[-2.0, 1.0]])
    loss, clipfrac, _, clipfrac_lower = compute_policy_loss(old, new, adv, torch.ones(1, 2), cliprange=0.2,
                                                            clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((2.0 * 3.0 + -1.0 * 1.1) / 2, rel=1e-6)  # 2*5 capped at 2*3
    assert clipfrac_lower.item() == pytest.approx(0.5)
    assert clipfrac.item() == pytest.approx(0.0)  # unclipped (5 > 1.2 means l1 > l2) and 1.1 inside the range
    loss.backward()
    assert new.grad[0, 0].item() == 0.0  # dual-clipped token carries no gradient
    assert new.grad[0, 1].item() == pytest.approx(-1.0 * 1.1 / 2, rel=1e-6)  # d(-A r)/dlogp = -A r, token-mean


def test_policy_loss_bf16_inputs_are_upcast():
    old, new, adv, mask = _pg_case()
    bf = [torch.tensor(x).to(torch.bfloat16) for x in (old, new, adv)]
    got = compute_policy_loss(*bf, torch.tensor(mask), cliprange=0.2)
    ref = compute_policy_loss(*[t.float() for t in bf], torch.tensor(mask), cliprange=0.2)
    assert got[0].dtype == torch.float32
    assert got[0].item() == ref[0].item()


def test_policy_loss_bad_config_raises():
    t = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_ratio"):
        compute_policy_loss(t, t, t, torch.ones(1, 2))
    with pytest.raises(ValueError, match="clip_ratio_c=1.0"):
        compute_policy_loss(t, t, t, torch.ones(1, 2), cliprange=0.2, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        compute_policy_loss(t, t, t, torch.ones(1, 2), cliprange=0.2, loss_agg_mode="mean")


def test_entropy_loss_matches_loop():
    logits = [[[0.0, 1.0, 2.0], [3.0, 3.0, 3.0]], [[-1.0, 0.0, 5.0], [9.0, 0.0, 0.0]]]
    mask = [[1, 1], [1, 0]]
    ents = []
    for row, m_row in zip(logits, mask):
        for zs, m in zip(row, m_row):
            total = sum(math.exp(z) for z in zs)
            if m:
                ents.append(-sum(math.exp(z) / total * (z - math.log(total)) for z in zs))
    got = compute_entropy_loss(torch.tensor(logits), torch.tensor(mask))
    assert got.item() == pytest.approx(sum(ents) / len(ents), rel=1e-5)


def test_value_loss_clipped_matches_loop():
    vpreds = [[1.0, 0.0, 2.0], [0.5, -3.0, 9.0]]
    values = [[0.0, 0.0, 1.8], [0.5, -1.0, 0.0]]
    returns = [[0.2, 1.0, 0.0], [0.0, -3.0, 0.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    eps = 0.5
    losses, clipped = [], []
    for vp_r, v_r, rt_r, m_r in zip(vpreds, values, returns, mask):
        for vp, v, rt, m in zip(vp_r, v_r, rt_r, m_r):
            if not m:
                continue
            vclip = min(max(vp, v - eps), v + eps)
            e1, e2 = (vp - rt) ** 2, (vclip - rt) ** 2
            losses.append(max(e1, e2))
            clipped.append(float(e2 > e1))
    vf_loss, vf_clipfrac = compute_value_loss(torch.tensor(vpreds), torch.tensor(returns), torch.tensor(values),
                                              torch.tensor(mask), cliprange_value=eps)
    assert vf_loss.item() == pytest.approx(0.5 * sum(losses) / len(losses), rel=1e-6)
    assert vf_clipfrac.item() == pytest.approx(sum(clipped) / len(clipped), rel=1e-6)
    assert 0 < vf_clipfrac.item() < 1
    with pytest.raises(ValueError, match="cliprange_value"):
        compute_value_loss(torch.tensor(vpreds), torch.tensor(returns), torch.tensor(values), torch.tensor(mask), -1)
