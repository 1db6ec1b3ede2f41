"""FlashAttention's variable-length kernel, causal, as both sides call it: the training forward over packed rows
(training/flash_segments.py) and the rollout's prefill over cached keys (rollout/attention.py).

Choices:
- Where it runs: CUDA, bf16/fp16, head dim <= 256, torch's varlen_attn present; `HYBRIDRL_PACKED_ATTENTION=flex`
  turns it off (A/B runs), and callers keep their own path elsewhere.
- The causal mask is aligned to the end of each key segment: query i of a segment of n queries over m keys sees
  keys 0 .. m - n + i — a sequence's new tokens over its cached ones, or a response over its shared prompt.
- Grouped-query attention: K/V heads reach FlashAttention-2 as they are, through its aten forward / backward ops
  (`HYBRIDRL_GQA=native`, the default; what torch 2.13's `enable_gqa` does). torch's public varlen_attn takes no
  grouped heads before 2.13, so `HYBRIDRL_GQA=varlen_attn` (kept for A/B runs) repeats K/V to the query heads
  there: a copy of K and V per layer and micro-batch and a sum of their gradients over each group. On one H200
  the native path measured 4% less attention time at the 1.5B's heads, 2% at the 7B's, and 5.6 GB less peak in the
  long-tail 1.5B step (benchmarks/results/long_tail/s53).
- Which FlashAttention (`HYBRIDRL_FLASH`): `fa2` (the default) runs FlashAttention-2 as above. `auto` runs
  FlashAttention-4's CuTe kernels (`flash_attn.cute`, the `fa4` extra; on Hopper they are FlashAttention-3's design:
  warp-specialised, TMA-fed, wgmma) where they are known to be right: importable, compute capability 9.x, the
  flash-attn-4 release whose gradients were checked (FA4_CHECKED_VERSIONS) and a head dim whose forward and
  gradients matched the dense reference on an H100 (FA4_CHECKED_HEAD_DIMS; at head dims 8, 16, 48 and 80
  flash-attn-4 4.0.0b40's dq was 72-100% off while its forward was right), and FlashAttention-2 elsewhere. `fa4`
  forces FlashAttention-4 and refuses, naming why, where it cannot run or gave wrong gradients; on 10.x (Blackwell,
  not checked here) and with other releases only forced, at the head dims its own checks take (on 10.x multiples
  of 8 up to 128, and 256). Both take grouped K/V heads as they are and align the causal mask at each key
  segment's end.
  Why FlashAttention-2 by default: on one H100 FlashAttention-4 took 0.63x FA2's time for the 1.5B update's
  attention (forward + backward), 0.55x at the 7B's heads and 16k lengths, and the long-tail 1.5B update alone
  6.01 against 6.45 s; inside the GRPO step no run has shown a gain yet (one machine: 9.24 / 8.55 against 9.32 /
  8.21 s, steps 2 / 3), its kernels compile in the run's first step (+7-10 s), and every in-step run with the
  extra installed was slowed by Liger's RoPE, which the extra's `cutlass` package turned into a CuTe kernel that
  recompiles for every packed length (training/liger.py now keeps Liger's Triton RoPE;
  benchmarks/results/long_tail/fa4_in_step).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os

import torch

__all__ = ["MAX_HEAD_DIM", "flash_available", "flash_impl", "varlen_causal_attention"]

MAX_HEAD_DIM = 256
GQA_MODES = ("native", "varlen_attn")
FLASH_IMPLS = ("fa2", "fa4", "auto")
FA4_ARCHS = (9, 10)   # compute capability majors FlashAttention-4's CuTe kernels build for here (Hopper, Blackwell)
# Head dims whose FlashAttention-4 forward and q/k/v gradients matched the dense reference per compute capability
# major (tests/training/test_flash_segments.py's GPU sweep over 8..256, one H100, flash-attn-4 4.0.0b40); `auto`
# takes FlashAttention-4 only at these.
FA4_CHECKED_HEAD_DIMS = {9: (24, 32, 64, 96, 128, 192, 256)}
FA4_CHECKED_VERSIONS = ("4.0.0b40",)   # flash-attn-4 releases that sweep ran on (a beta: its kernels change)


@functools.cache
def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def flash_available(device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether varlen_causal_attention runs here (FlashAttention-2 through torch, or FlashAttention-4 where chosen)."""
    return (torch.device(device).type == "cuda" and dtype in (torch.bfloat16, torch.float16)
            and head_dim <= MAX_HEAD_DIM and os.environ.get("HYBRIDRL_PACKED_ATTENTION", "flash") != "flex"
            and (_varlen() is not None or flash_impl(device, head_dim) == "fa4"))


@functools.cache
def _fa4():
    """FlashAttention-4's varlen entry point, or the reason it cannot be imported."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as e:  # absent, or its CuTe DSL runtime does not load here
        return None, f"flash_attn.cute does not import ({type(e).__name__}: {e})"
    return flash_attn_varlen_func, None


def _fa4_version() -> str:
    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _fa4_unfit(device, head_dim: int, forced: bool = False) -> str | None:
    """Why FlashAttention-4 cannot run this call here (`forced`: also where its gradients were never checked), or
    None."""
    if device.type != "cuda":
        return f"{device.type} is not a CUDA device"
    fn, why = _fa4()
    if fn is None:
        return why
    major = torch.cuda.get_device_capability(device)[0]
    if major not in FA4_ARCHS:
        return f"compute capability {major}.x (its kernels here: {', '.join(f'{a}.x' for a in FA4_ARCHS)})"
    if major == 9 and head_dim not in FA4_CHECKED_HEAD_DIMS[9]:
        return (f"head_dim {head_dim} (on 9.x taken only at the head dims whose gradients were checked: "
                f"{', '.join(map(str, FA4_CHECKED_HEAD_DIMS[9]))}; at 8, 16, 48 and 80 its dq was wrong)")
    if major == 10 and (head_dim % 8 or not (8 <= head_dim <= 128 or head_dim == 256)):
        return f"head_dim {head_dim} (on 10.x it takes multiples of 8 from 8 to 128, and 256)"
    if forced:
        return None
    if major not in FA4_CHECKED_HEAD_DIMS:
        return f"compute capability {major}.x: its gradients were never checked there (HYBRIDRL_FLASH=fa4 forces it)"
    if (version := _fa4_version()) not in FA4_CHECKED_VERSIONS:
        return (f"flash-attn-4 {version}: its gradients were checked with {', '.join(FA4_CHECKED_VERSIONS)} only "
                f"(HYBRIDRL_FLASH=fa4 forces it)")
    return None


def flash_impl(device, head_dim: int) -> str:
    """`HYBRIDRL_FLASH` (fa2 unless set): which FlashAttention runs a varlen call on this device, fa2 or fa4 (see the
    module notes)."""
    mode = os.environ.get("HYBRIDRL_FLASH", "fa2")
    if mode not in FLASH_IMPLS:
        raise ValueError(f"HYBRIDRL_FLASH={mode!r}: expected one of {', '.join(FLASH_IMPLS)}")
    if mode == "fa2":
        return "fa2"
    why = _fa4_unfit(torch.device(device), head_dim, mode == "fa4")
    if why is None:
        return "fa4"
    if mode == "fa4":
        raise RuntimeError(f"HYBRIDRL_FLASH=fa4: FlashAttention-4 cannot run here: {why}")
    return "fa2"


def gqa_mode() -> str:
    """`HYBRIDRL_GQA`: native (FlashAttention-2's aten ops, grouped heads as they are; the default) or varlen_attn
    (torch's public op; K/V repeated where it takes no grouped heads)."""
    mode = os.environ.get("HYBRIDRL_GQA", "native")
    if mode not in GQA_MODES:
        raise ValueError(f"HYBRIDRL_GQA={mode!r}: expected one of {', '.join(GQA_MODES)}")
    return mode


class FlashVarlenCausal(torch.autograd.Function):
    """aten's FlashAttention-2 varlen forward / backward, causal (aligned at each key segment's end), no dropout;
    K/V may have fewer heads than Q (a divisor of them)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, rng, unused)
        ctx.sizes = (max_q, max_k, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k, rng, unused = ctx.saved_tensors
        max_q, max_k, scale = ctx.sizes
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            _dense_last(dout), q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, True, rng, unused, scale=scale)
        return dq, dk, dv, None, None, None, None, None


def _dense_last(t: torch.Tensor) -> torch.Tensor:
    """The kernel takes any token and head strides but a contiguous head dim."""
    return t if t.stride(-1) == 1 else t.contiguous()


def varlen_causal_attention(q_TND, k_SKD, v_SKD, cu_q, cu_k, max_q: int, max_k: int, scale) -> torch.Tensor:
    """q [T, N, D] (query segments cu_q), k/v [S, K, D] (key segments cu_k; K divides N) -> [T, N, D]."""
    N, K = q_TND.shape[1], k_SKD.shape[1]
    if N % K:
        raise ValueError(f"varlen_causal_attention: {N} query heads are not a multiple of {K} key/value heads")
    scale = q_TND.shape[-1] ** -0.5 if scale is None else float(scale)
    if flash_impl(q_TND.device, q_TND.shape[-1]) == "fa4":
        fn = _fa4()[0]
        return fn(q_TND, k_SKD, v_SKD, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(max_q),
                  max_seqlen_k=int(max_k), softmax_scale=scale, causal=True)[0]
    if gqa_mode() == "native":
        return FlashVarlenCausal.apply(_dense_last(q_TND), _dense_last(k_SKD), _dense_last(v_SKD), cu_q, cu_k,
                                       int(max_q), int(max_k), scale)
    fn, params = _varlen()
    kwargs = {"scale": scale}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    if N != K:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k_SKD, v_SKD = k_SKD.repeat_interleave(N // K, dim=1), v_SKD.repeat_interleave(N // K, dim=1)
    return fn(q_TND, k_SKD.contiguous(), v_SKD.contiguous(), cu_q, cu_k, max_q, max_k, **kwargs)
