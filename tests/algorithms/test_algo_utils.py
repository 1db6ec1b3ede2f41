"""Masked statistics against plain-Python loops; chunked log-prob / entropy against float64 autograd."""

import math

import pytest
import torch

from hybridrl.algorithms import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
)

VALUES = [[1.0, 2.0, 3.0, 9.0], [4.0, -1.0, 7.0, 7.0]]
MASK = [[1, 1, 1, 0], [1, 0, 1, 1]]


def _masked_list():
    return [v for vr, mr in zip(VALUES, MASK) for v, m in zip(vr, mr) if m]


def test_masked_mean_var_whiten_match_loops():
    vals, mask = torch.tensor(VALUES), torch.tensor(MASK)
    xs = _masked_list()
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    assert masked_mean(vals, mask).item() == pytest.approx(mean, rel=1e-6)
    assert masked_var(vals, mask).item() == pytest.approx(var, rel=1e-6)
    assert masked_var(vals, mask, unbiased=False).item() == pytest.approx(var * (len(xs) - 1) / len(xs), rel=1e-6)
    white = masked_whiten(vals, mask)
    for i in range(2):
        for j in range(4):
            assert white[i, j].item() == pytest.approx((VALUES[i][j] - mean) / math.sqrt(var + 1e-8), rel=1e-5)
    unshifted = masked_whiten(vals, mask, shift_mean=False)
    assert unshifted[0, 0].item() == pytest.approx((1.0 - mean) / math.sqrt(var + 1e-8) + mean, rel=1e-5)


def test_masked_mean_axis_and_empty_mask():
    vals, mask = torch.tensor(VALUES), torch.tensor(MASK)
    per_row = masked_mean(vals, mask, axis=-1)
    assert per_row.tolist() == pytest.approx([2.0, 6.0])
    assert masked_mean(vals, torch.zeros_like(mask)).item() == 0.0


@pytest.mark.parametrize("count", [0, 1])
def test_masked_var_rejects_too_few_tokens(count):
    mask = torch.zeros(2, 4)
    mask[0, :count] = 1
    with pytest.raises(ValueError, match="mask"):
        masked_var(torch.tensor(VALUES), mask)


@pytest.mark.parametrize("chunk_size", [1, 3, None])
def test_logprobs_value_and_grad_match_log_softmax(chunk_size):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 11, generator=g, dtype=torch.float64) * 4).requires_grad_()
    labels = torch.randint(0, 11, (2, 5), generator=g)
    weights = torch.randn(2, 5, generator=g, dtype=torch.float64)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    out = logprobs_from_logits(logits.float(), labels, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and out.shape == (2, 5)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad((out * weights.float()).sum(), logits)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-5)


def test_logprobs_bf16_logits_give_fp32_and_bf16_grad():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 7, 50, generator=g) * 3).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 50, (3, 7), generator=g)
    out = logprobs_from_logits(logits, labels, chunk_size=4)
    ref = torch.log_softmax(logits.detach().double(), -1).gather(-1, labels[..., None]).squeeze(-1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)  # exact on the bf16 values, no bf16 rounding
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    assert torch.isfinite(logits.grad.float()).all()


def test_logprobs_shape_mismatch_raises():
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_entropy_matches_loop_and_autograd():
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(3, 4, 6, generator=g, dtype=torch.float64) * 2).requires_grad_()
    out = entropy_from_logits(logits.float(), chunk_size=5)
    for i in range(3):
        for j in range(4):
            zs = logits[i, j].tolist()
            z_max = max(zs)
            ps = [math.exp(z - z_max) for z in zs]
            total = sum(ps)
            expected = -sum(p / total * math.log(p / total) for p in ps)
            assert out[i, j].item() == pytest.approx(expected, rel=1e-5)
    weights = torch.randn(3, 4, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    ref = -(p * torch.log_softmax(logits, -1)).sum(-1)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    (grad,) = torch.autograd.grad((out * weights.float()).sum(), logits)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


def test_low_precision_mask_counts_exactly():
    values = torch.full((1, 3000), 2.0)
    mask = torch.ones(1, 3000, dtype=torch.bfloat16)  # bf16 cannot hold 3000 exactly (2992 / 3008)
    assert masked_mean(values, mask).item() == pytest.approx(2.0, rel=1e-6)
