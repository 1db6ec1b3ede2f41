"""Masked statistics and memory-lean log-prob / entropy over logits (verl's torch_functional names).

Shape legend: B batch, R response length, V vocabulary, N = rows after flattening the leading dims.

Choices:
- Every function upcasts bf16/fp16 inputs to fp32 and returns fp32: advantages, ratios and log-probs
  differ in the third digit when kept in bf16, and an exp(log_prob - old_log_prob) of two bf16 numbers
  is a wrong ratio, not a rounding detail. The upcast (`.float()`) keeps the autograd graph.
- masked_mean adds 1e-8 to the denominator and masked_var / masked_whiten follow verl exactly
  (Bessel correction over the masked count, whitening with rsqrt(var + 1e-8)), so numbers match verl.
- logprobs_from_logits and entropy_from_logits walk the rows in chunks (algorithms/chunked_logprob.py, the
  routine the fused log-prob head runs too): forward keeps only the logits (already alive) and a few fp32
  values per row; backward recomputes the softmax chunk by chunk. Peak extra memory is a couple of fp32
  chunks (about 256 MB each by default) instead of a full fp32 log_softmax of [N, V] (with V = 152k,
  8k tokens → 5 GB). The gradient tensor itself has the logits' dtype.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.chunked_logprob import GivenLogits, chunked_logprob_entropy, chunked_sum_pi_squared

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "logprobs_from_logits",
    "entropy_from_logits",
    "sum_pi_squared_from_logits",
    "clip_by_value",
]

def _to_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.is_floating_point() and x.dtype != torch.float64 else x


def _fp32_mask(mask: torch.Tensor) -> torch.Tensor:
    # a bf16 mask would count 3000 tokens as 2992: counts are always taken in fp32 (bool/int stay exact)
    return mask.float() if mask.is_floating_point() and mask.dtype != torch.float64 else mask


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    """sum(values * mask); values outside the mask are zeroed first, so a NaN/inf in padding cannot leak in."""
    values, mask = _to_fp32(values), _fp32_mask(mask)
    kept = torch.where(mask.bool(), values, 0.0) * mask
    return kept.sum() if axis is None else kept.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    """sum(values * mask) / (sum(mask) + 1e-8); an all-zero mask gives 0, not NaN."""
    mask = _fp32_mask(mask)
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked elements (all of them, one scalar), Bessel-corrected when unbiased."""
    mean = masked_mean(values, mask)
    variance = masked_mean((_to_fp32(values) - mean) ** 2, mask)
    if unbiased:
        count = _fp32_mask(mask).sum()
        if count == 0:
            raise ValueError("masked_var: the mask has no 1 entries; at least two are needed for an unbiased variance")
        if count == 1:
            raise ValueError("masked_var: the mask has a single 1 entry; the unbiased variance divides by "
                             "count - 1 = 0 (need at least two valid tokens)")
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with mean and unbiased var over the masked elements.
    shift_mean=False adds the mean back (scale only). Positions outside the mask are transformed too."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (_to_fp32(values) - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise clamp to [tensor_min, tensor_max] (tensors allowed as bounds)."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """log softmax(logits)[labels] in fp32: logits [..., V], labels [...] (int) → [...] fp32.

    Computed as gather - logsumexp on max-subtracted logits (shift-invariant), over chunks of `chunk_size` rows
    (default: ~64Mi elements a chunk)."""
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logprobs_from_logits: logits {tuple(logits.shape)} must be labels {tuple(labels.shape)} + [V]")
    log_p, _ = chunked_logprob_entropy(GivenLogits(), (logits.reshape(-1, logits.shape[-1]),), labels,
                                       with_entropy=False, chunk_size=chunk_size)
    return log_p.reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) in fp32: [..., V] → [...], chunked.

    Computed on max-subtracted logits z' = z - max(z): logsumexp(z') - sum softmax(z') * z', the same value
    for z + c as for z (no cancellation between two large numbers) and never negative."""
    _, entropy = chunked_logprob_entropy(GivenLogits(), (logits.reshape(-1, logits.shape[-1]),), None,
                                         with_entropy=True, chunk_size=chunk_size)
    return entropy.reshape(logits.shape[:-1])


def sum_pi_squared_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Σ_v softmax(logits)_v² in fp32: [..., V] → [...], chunked, without a gradient (verl's
    calculate_sum_pi_squared_from_logits: the optimal token baseline's score-norm term)."""
    out = chunked_sum_pi_squared(GivenLogits(), (logits.reshape(-1, logits.shape[-1]),), chunk_size)
    return out.reshape(logits.shape[:-1])
