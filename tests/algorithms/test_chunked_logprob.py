"""The chunked log-prob / entropy routine (behind logprobs_from_logits, entropy_from_logits and the fused head)
against plain PyTorch — log_softmax + gather, and -sum p log p — on random logits: fp32 and bf16, values alone
(no gradient) and values with gradients, over several chunks with a partial last one."""

import pytest
import torch

from hybridrl.algorithms.chunked_logprob import GivenLogits, chunk_rows, chunked_logprob_entropy


def reference(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = torch.log_softmax(logits.double(), -1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def random_rows(dtype: torch.dtype, seed: int = 0, n: int = 23, vocab: int = 41):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=g) * 4 + 30).to(dtype)   # an offset: shift-invariance is exercised
    return logits, torch.randint(0, vocab, (n,), generator=g), torch.randn(n, 2, generator=g, dtype=torch.float64)


# values: the bf16 logits are exact in fp32, so the values are as close to the reference as in fp32;
# gradients come back in the logits' dtype
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_match_log_softmax_and_entropy_without_gradients(dtype):
    logits, targets, _ = random_rows(dtype)
    ref_lp, ref_h = reference(logits, targets)
    with torch.no_grad():
        log_p, entropy = chunked_logprob_entropy(GivenLogits(), (logits,), targets, True, chunk_size=5)
    assert log_p.dtype == entropy.dtype == torch.float32 and not log_p.requires_grad
    torch.testing.assert_close(log_p.double(), ref_lp, rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy.double(), ref_h, rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype,grad_tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_values_and_gradients_match_log_softmax_and_entropy(dtype, grad_tol, entropy_grad):
    logits, targets, weights = random_rows(dtype, seed=1)
    x = logits.clone().requires_grad_()
    log_p, entropy = chunked_logprob_entropy(GivenLogits(), (x,), targets, True, entropy_grad, chunk_size=5)
    assert log_p.requires_grad and entropy.requires_grad == entropy_grad
    h_weight = weights[:, 1] * entropy_grad   # a measured entropy is not part of the loss
    ((log_p.double() * weights[:, 0]).sum() + (entropy.double() * h_weight).sum()).backward()
    assert x.grad.dtype == dtype
    ref_x = logits.double().requires_grad_()
    ref_lp, ref_h = reference(ref_x, targets)
    ((ref_lp * weights[:, 0]).sum() + (ref_h * h_weight).sum()).backward()
    torch.testing.assert_close(log_p.detach().double(), ref_lp.detach(), rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy.detach().double(), ref_h.detach(), rtol=0, atol=2e-5)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=grad_tol, atol=grad_tol)


def test_entropy_alone_and_log_probs_alone():
    """Without targets the log-probs are zeros and not differentiable; without with_entropy the entropy is."""
    logits, targets, _ = random_rows(torch.float32, seed=2)
    x = logits.clone().requires_grad_()
    log_p, entropy = chunked_logprob_entropy(GivenLogits(), (x,), None, True)
    assert (log_p == 0).all() and not log_p.requires_grad and entropy.requires_grad
    log_p, entropy = chunked_logprob_entropy(GivenLogits(), (x,), targets, False)
    assert (entropy == 0).all() and not entropy.requires_grad and log_p.requires_grad


def test_chunk_rows():
    assert chunk_rows(152064) == (256 << 20) // (4 * 152064)
    assert chunk_rows(1 << 40) == 1 and chunk_rows(0) == 1 << 26
    assert chunk_rows(50, chunk_size=7) == 7
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_rows(50, chunk_size=0)


class _FiniteLogits(GivenLogits):
    finite = True


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_the_finite_formulas_equal_the_max_subtracted_ones(entropy_grad):
    """The fused head's path (no max, no p = 0 masks) gives the masked path's values and gradients on finite logits,
    across chunk boundaries and at a temperature."""
    torch.manual_seed(3)
    logits = (torch.randn(29, 70, dtype=torch.float64) * 4).float()
    targets = torch.randint(0, 70, (29,))
    results = []
    for source in (GivenLogits(), _FiniteLogits()):
        source.temperature = 0.7
        x = logits.clone().requires_grad_()
        log_p, ent = chunked_logprob_entropy(source, (x,), targets, True, entropy_grad, chunk_size=8)
        (log_p.sum() * 1.3 + (ent.sum() * 0.4 if entropy_grad else 0)).backward()
        results.append((log_p.detach(), ent.detach(), x.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
