"""FlashAttention's variable-length kernel (torch.nn.attention.varlen), causal, as both sides call it: the training
forward over packed rows (training/flash_segments.py) and the rollout's prefill over cached keys
(rollout/attention.py).

Choices:
- Where it runs: CUDA, bf16/fp16, head dim <= 256, torch's varlen_attn present; `HYBRIDRL_PACKED_ATTENTION=flex`
  turns it off (A/B runs), and callers keep their own path elsewhere.
- The causal mask is aligned to the end of each key segment: query i of a segment of n queries over m keys sees
  keys 0 .. m - n + i — a sequence's new tokens over its cached ones, or a response over its shared prompt.
- torch's varlen_attn has changed its signature between releases (`is_causal` vs `window_size`, `enable_gqa`
  present or not): the call adapts to what the installed version takes, repeating K/V heads when it has no GQA.
"""

from __future__ import annotations

import functools
import inspect
import os

import torch

__all__ = ["MAX_HEAD_DIM", "flash_available", "varlen_causal_attention"]

MAX_HEAD_DIM = 256


@functools.cache
def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def flash_available(device, dtype: torch.dtype, head_dim: int) -> bool:
    return (torch.device(device).type == "cuda" and dtype in (torch.bfloat16, torch.float16)
            and head_dim <= MAX_HEAD_DIM and os.environ.get("HYBRIDRL_PACKED_ATTENTION", "flash") != "flex"
            and _varlen() is not None)


def varlen_causal_attention(q_TND, k_SKD, v_SKD, cu_q, cu_k, max_q: int, max_k: int, scale) -> torch.Tensor:
    """q [T, N, D] (query segments cu_q), k/v [S, K, D] (key segments cu_k; K divides N) -> [T, N, D]."""
    fn, params = _varlen()
    kwargs = {"scale": scale}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    if q_TND.shape[1] != k_SKD.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            rep = q_TND.shape[1] // k_SKD.shape[1]
            k_SKD, v_SKD = k_SKD.repeat_interleave(rep, dim=1), v_SKD.repeat_interleave(rep, dim=1)
    return fn(q_TND, k_SKD.contiguous(), v_SKD.contiguous(), cu_q, cu_k, max_q, max_k, **kwargs)
