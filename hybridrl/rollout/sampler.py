"""Sampler: greedy, temperature, top-k, top-p with a torch.Generator; returns each token's log-prob.

Choices:
- The returned log-prob is log_softmax(logits / temperature)[token] over the FULL vocabulary (before
  top-k/top-p truncation), raw log_softmax(logits) for greedy rows: exactly what the actor's
  compute_log_prob computes at the same temperature, so rollout and actor log-probs can be compared.
- Sampling uses the exponential-race trick (argmax p / E, E ~ Exp(1)) with the caller's generator:
  one kernel, no multinomial sync, and the same seed gives the same tokens.
- top-k / top-p sort only when some row asks for them; the top-p rule keeps the smallest prefix
  whose mass reaches top_p (the first token always survives).

Shape legend: B rows, V vocab.
"""

from __future__ import annotations

import torch


def sample(logits_BV, temperature_B, top_k_B, top_p_B, generator=None):
    """-> (token ids [B] int64, log-probs [B] fp32). temperature 0 = greedy; top_k <= 0 or >= V = off."""
    logits_BV = logits_BV.float()
    greedy_B = temperature_B <= 0
    scaled = logits_BV / torch.where(greedy_B, 1.0, temperature_B)[:, None]
    logp_BV = torch.log_softmax(scaled, dim=-1)
    tokens = logits_BV.argmax(dim=-1)
    if not bool(greedy_B.all()):
        filtered = scaled
        V = logits_BV.shape[-1]
        use_k = bool(((top_k_B > 0) & (top_k_B < V)).any())
        use_p = bool((top_p_B < 1).any())
        if use_k or use_p:
            vals, idx = scaled.sort(dim=-1, descending=True)
            drop = torch.zeros_like(vals, dtype=torch.bool)
            if use_k:
                k = torch.where(top_k_B > 0, top_k_B, V)
                drop |= torch.arange(V, device=vals.device)[None, :] >= k[:, None]
            if use_p:
                probs = vals.softmax(-1)
                drop |= (probs.cumsum(-1) - probs) >= top_p_B[:, None]
            vals = vals.masked_fill(drop, float("-inf"))
            filtered = torch.full_like(scaled, float("-inf")).scatter(1, idx, vals)
        probs = filtered.softmax(-1)
        race = torch.empty_like(probs).exponential_(1.0, generator=generator)
        sampled = (probs / race).argmax(dim=-1)
        tokens = torch.where(greedy_B, tokens, sampled)
    return tokens, logp_BV.gather(1, tokens[:, None]).squeeze(1)
