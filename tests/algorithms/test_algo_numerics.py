"""Adversarial inputs: shifted and one-hot logits, NaN/inf in the padding of every masked reduction and loss."""

import math

import pytest
import torch

from hybridrl.algorithms import (
    agg_loss,
    compute_policy_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
)
from hybridrl.algorithms.policy_loss import LOSS_AGG_MODES


def _entropy_fp64(z: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(z.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("shift", [0.0, 1e3, 3e4])
def test_entropy_and_logprob_are_shift_invariant(shift):
    torch.manual_seed(0)
    z = torch.randn(16, 500) * 4 + shift  # the fp32 input itself; the reference reads the same numbers in fp64
    assert (entropy_from_logits(z, chunk_size=5).double() - _entropy_fp64(z)).abs().max() < 1e-4
    labels = torch.randint(0, 500, (16,))
    ref = torch.log_softmax(z.double(), -1).gather(-1, labels[:, None]).squeeze(-1)
    assert (logprobs_from_logits(z, labels).double() - ref).abs().max() < 1e-4


def test_entropy_gradient_on_shifted_logits():
    torch.manual_seed(1)
    z = (torch.randn(4, 50) + 2e4).requires_grad_(True)
    entropy_from_logits(z, chunk_size=3).sum().backward()
    z64 = z.detach().double().requires_grad_(True)
    _entropy_fp64(z64).sum().backward()
    assert (z.grad.double() - z64.grad).abs().max() < 1e-4


def test_entropy_of_one_hot_and_masked_vocab_rows():
    rows = torch.full((6, 300), -2.0)
    rows[torch.arange(6), 7] = torch.tensor([5.0, 20.0, 40.0, 90.0, 1e4, 1e6])
    ent = entropy_from_logits(rows)
    assert (ent >= 0).all()
    assert ent[-3:].max() < 1e-30  # one-hot to fp32 precision
    masked_vocab = torch.tensor([[0.0, 0.0, -math.inf, -math.inf]])
    assert entropy_from_logits(masked_vocab).item() == pytest.approx(math.log(2), rel=1e-6)
    z = masked_vocab.clone().requires_grad_(True)
    entropy_from_logits(z).sum().backward()
    assert torch.isfinite(z.grad).all()


def _poisoned(clean: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = clean.clone()
    bad = [math.nan, math.inf, -math.inf]
    for k, idx in enumerate((mask == 0).nonzero()):
        out[tuple(idx)] = bad[k % 3]
    return out


MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)


def test_masked_reductions_ignore_non_finite_padding():
    torch.manual_seed(2)
    clean = torch.randn(3, 5) * MASK
    dirty = _poisoned(clean, MASK)
    assert torch.equal(masked_sum(dirty, MASK), masked_sum(clean, MASK))
    assert torch.equal(masked_mean(dirty, MASK, axis=-1), masked_mean(clean, MASK, axis=-1))
    for mode in LOSS_AGG_MODES:
        assert torch.equal(agg_loss(dirty, MASK, mode), agg_loss(clean, MASK, mode)), mode
        assert torch.isfinite(agg_loss(dirty, MASK, mode))


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "cispo"])
def test_policy_losses_ignore_non_finite_padding(mode):
    torch.manual_seed(3)
    old = -torch.rand(3, 5) * MASK
    new = old + 0.1 * torch.randn(3, 5) * MASK
    adv = torch.randn(3, 5) * MASK
    config = {"clip_ratio": 0.2, "policy_loss": {"clip_cov_ratio": 0.5, "kl_cov_ratio": 0.5}}
    results = []
    for poison in (False, True):
        log_prob = (_poisoned(new, MASK) if poison else new).detach().clone().requires_grad_(True)
        args = [_poisoned(old, MASK) if poison else old, log_prob, _poisoned(adv, MASK) if poison else adv, MASK]
        torch.manual_seed(0)
        loss, metrics = get_policy_loss_fn(mode)(*args, config=config)
        loss.backward()
        # metrics are 0-d tensors or floats; pytest.approx compares flat dicts of numbers only
        results.append((loss.item(), {k: float(v) for k, v in metrics.items()}, log_prob.grad))
    (clean_loss, clean_metrics, clean_grad), (dirty_loss, dirty_metrics, dirty_grad) = results
    assert dirty_loss == pytest.approx(clean_loss, abs=1e-7)
    assert dirty_metrics == pytest.approx(clean_metrics, abs=1e-7)
    assert torch.isfinite(dirty_grad).all()  # exp(nan) in padding would otherwise send nan into the model
    assert torch.allclose(dirty_grad, clean_grad, atol=1e-7)


def test_compute_policy_loss_ignores_non_finite_padding():
    old, new, adv = -torch.ones(3, 5), -0.5 * torch.ones(3, 5), torch.ones(3, 5)
    clean = compute_policy_loss(old, new, adv, MASK, cliprange=0.2)
    dirty = compute_policy_loss(_poisoned(old, MASK), _poisoned(new, MASK), _poisoned(adv, MASK), MASK, cliprange=0.2)
    assert [t.item() for t in dirty] == [t.item() for t in clean]
