"""Rotary position embedding for the rollout decoder.

Choices: our own inverse-frequency code for the two rope types the supported families use ('default'
and Llama 3's 'llama3' scaling, same formulas as transformers), read from either transformers-5's
`rope_parameters` or the older `rope_theta`/`rope_scaling` fields, so the same code runs with
transformers 5.17 and 5.24. Any other rope type raises ValueError pointing at `rollout.name=hf`.
cos/sin are precomputed up to max_model_len in fp32 (a plain tensor, not a module buffer, so that
`to_empty(meta)` on sleep does not touch it) and applied in the model dtype, like HF.
"""

from __future__ import annotations

import math

import torch


def rope_params(config) -> dict:
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None)
    if scaling:
        params = {**scaling, **params}
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def inv_frequencies(config, head_dim: int) -> torch.Tensor:
    p = rope_params(config)
    inv_freq = 1.0 / (p["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if p["rope_type"] == "default":
        return inv_freq
    if p["rope_type"] != "llama3":
        raise ValueError(f"rope type {p['rope_type']!r} is not supported by the native rollout engine "
                         "(supported: default, llama3); use actor_rollout_ref.rollout.name=hf")
    factor, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / lo, old_len / hi
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin_cache(config, head_dim: int, max_len: int, device) -> torch.Tensor:
    """[max_len, head_dim] cos followed by [max_len, head_dim] sin, stacked: [2, max_len, head_dim]."""
    inv_freq = inv_frequencies(config, head_dim).to(device)
    t = torch.arange(max_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return torch.stack([emb.cos(), emb.sin()])


def apply_rope(x_TND: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor) -> torch.Tensor:
    half = x_TND.shape[-1] // 2
    rotated = torch.cat([-x_TND[..., half:], x_TND[..., :half]], dim=-1)
    return x_TND * cos_TD.unsqueeze(1) + rotated * sin_TD.unsqueeze(1)
