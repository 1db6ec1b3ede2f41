"""Sampler: greedy, temperature, top-k, top-p with a torch.Generator; returns each token's log-prob.

Choices:
- The returned log-prob is log_softmax(logits / temperature)[token] over the FULL vocabulary (before
  top-k/top-p truncation), raw log_softmax(logits) for greedy rows: exactly what the actor's
  compute_log_prob computes at the same temperature, so rollout and actor log-probs can be compared.
- Sampling uses the exponential-race trick (argmax p / E, E ~ Exp(1)) with the caller's generator:
  one kernel, no multinomial sync, and the same seed gives the same tokens.
- top-k / top-p sort only when some row asks for them; the top-p rule keeps the smallest prefix
  whose mass reaches top_p (the first token always survives).
- The step loop passes `flags` (all greedy / any top-k / any top-p), known on the host from the
  SamplingParams, so deciding the path needs no device->host sync; without them they are read from
  the tensors (the tests' entry point). Batches without top-k/top-p take the one-pass Triton kernel
  of triton_sample.py when fused kernels are enabled (CUDA, or HYBRIDRL_FUSED=force under the
  interpreter): same noise tensor from the same generator, same exponential race.

Shape legend: B rows, V vocab.
"""

from __future__ import annotations

import torch

from hybridrl.models import fused


def sample(logits_BV, temperature_B, top_k_B, top_p_B, generator=None, flags=None):
    """-> (token ids [B] int64, log-probs [B] fp32). temperature 0 = greedy; top_k <= 0 or >= V = off.
    flags=(all_greedy, use_top_k, use_top_p) when the caller knows them on the host (no device sync)."""
    V = logits_BV.shape[-1]
    greedy_B = temperature_B <= 0
    if flags is None:
        flags = (bool(greedy_B.all()), bool(((top_k_B > 0) & (top_k_B < V)).any()), bool((top_p_B < 1).any()))
    all_greedy, use_k, use_p = flags
    if not (use_k or use_p) and fused.enabled(logits_BV):
        from hybridrl.rollout.triton_sample import sample_plain

        return sample_plain(logits_BV, temperature_B, None if all_greedy else generator, all_greedy)
    logits_BV = logits_BV.float()
    scaled = scale(logits_BV, temperature_B)
    logp_BV = torch.log_softmax(scaled, dim=-1)
    tokens = logits_BV.argmax(dim=-1)
    if not all_greedy:
        probs = truncate(scaled, top_k_B, top_p_B, use_k, use_p).softmax(-1)
        race = torch.empty_like(probs).exponential_(1.0, generator=generator)
        sampled = (probs / race).argmax(dim=-1)
        tokens = torch.where(greedy_B, tokens, sampled)
    return tokens, logp_BV.gather(1, tokens[:, None]).squeeze(1)


def scale(logits_BV, temperature_B):
    """fp32 logits / temperature (greedy rows, temperature <= 0, unscaled): what log-probs are taken over."""
    return logits_BV.float() / torch.where(temperature_B <= 0, 1.0, temperature_B)[:, None]


def truncate(scaled_BV, top_k_B, top_p_B, use_k: bool, use_p: bool):
    """Scaled logits with the tokens top-k / top-p drop set to -inf: the softmax of this is what a row samples."""
    if not (use_k or use_p):
        return scaled_BV
    V = scaled_BV.shape[-1]
    vals, idx = scaled_BV.sort(dim=-1, descending=True)
    drop = torch.zeros_like(vals, dtype=torch.bool)
    if use_k:
        k = torch.where(top_k_B > 0, top_k_B, V)
        drop |= torch.arange(V, device=vals.device)[None, :] >= k[:, None]
    if use_p:
        probs = vals.softmax(-1)
        drop |= (probs.cumsum(-1) - probs) >= top_p_B[:, None]
    vals = vals.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled_BV, float("-inf")).scatter(1, idx, vals)
