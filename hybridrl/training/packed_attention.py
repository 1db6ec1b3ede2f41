"""The attention function of packed forwards, registered with transformers' `AttentionInterface` under
`VARLEN_ATTN`: one packed row of documents, each attending causally to itself only.

Shapes: T packed tokens, H / Hkv query / key-value heads, D head width.

Choices:
- On CUDA in bf16/fp16, FlashAttention's varlen kernel as torch ships it (training/flash_segments.py; on an H200
  its backward was several times faster than FlexAttention's on long documents); else FlexAttention with a
  document mask on CUDA (compiled once; rows of FLEX_MIN_TOKENS or more), else SDPA with a block-diagonal causal
  mask.
- Without `cu_seq_lens_q` it delegates to HF's SDPA function, so the same model also runs the padded path. The
  matching mask function returns None when no 2-D padding mask is given (packed or unpadded input: the attention
  function owns causality) and HF's SDPA mask otherwise.
- Shared prompts (training/packing.py `SharedPrompts`): a response token attends to its document's prompt and its
  own response only, so outputs and gradients are those of the unshared rows (the prompt's activations receive
  the sum of its rows' gradients, as its copies' parameter gradients summed before).
- Ulysses sequence parallelism (`sp_group`, training/ulysses.py): the function all-to-alls q/k/v from this rank's
  slice of the packed row to whole sequences (a share of the heads each) and the output back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridrl.training.flash_segments import flash_usable, flash_varlen_attention
from hybridrl.training.packing import SharedPrompts
from hybridrl.training.ulysses import ulysses_out, ulysses_qkv

VARLEN_ATTN = "hybridrl_varlen"

__all__ = ["VARLEN_ATTN", "FLEX_MIN_TOKENS", "register_varlen_attention", "varlen_attention_forward"]


def _doc_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(lens.numel(), device=cu_seqlens.device), lens, output_size=total)


def _allowed(cu_seqlens: torch.Tensor, total: int, shared: SharedPrompts | None):
    """mask_mod(b, h, q_idx, kv_idx) of a packed row: causal within each document; with shared prompts a response
    token also sees only its document's prompt and its own response (not its siblings')."""
    docs = _doc_ids(cu_seqlens, total)
    if shared is None:
        def doc_causal(b, h, q_idx, kv_idx):
            return (docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
        return doc_causal
    segment, is_prompt = shared.segment, shared.is_prompt

    def prompt_shared(b, h, q_idx, kv_idx):
        return ((docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
                & (is_prompt[kv_idx] | (segment[q_idx] == segment[kv_idx])))
    return prompt_shared


_compiled_flex = None
# For a 112-token packed row inductor found no kernel configuration for the compiled training forward
# (NoValidChoicesError, H200, torch 2.11; rows of 219 tokens and more compiled): rows shorter than one FlexAttention
# block (128) take the dense mask, which costs nothing at that size.
FLEX_MIN_TOKENS = 128


def _flex_attention(query, key, value, cu_seqlens, scaling, shared):
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    total = query.shape[2]
    # One block mask per forward: cached on the cu_seqlens tensor (the same object reaches every layer).
    cached = getattr(cu_seqlens, "_hybridrl_block_mask", None)
    if cached is None:
        cached = create_block_mask(_allowed(cu_seqlens, total, shared), None, None, total, total,
                                   device=query.device)
        cu_seqlens._hybridrl_block_mask = cached
    enable_gqa = query.shape[1] != key.shape[1]
    return _compiled_flex(query, key, value, block_mask=cached, scale=scaling, enable_gqa=enable_gqa)


def _sdpa_block_diagonal(query, key, value, cu_seqlens, scaling, shared):
    total = query.shape[2]
    pos = torch.arange(total, device=query.device)
    mask = _allowed(cu_seqlens, total, shared)(None, None, pos[:, None], pos[None, :])
    if key.shape[1] != query.shape[1]:
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask[None, None], scale=scaling)


def no_mask() -> torch.Tensor:
    """The packed forwards' `attention_mask`: an empty 4-D tensor, which transformers takes as a mask already built
    and passes through. Without it, building the mask of a packed row starts with `find_packed_sequence_indices`,
    whose `.all()` makes the host wait for the GPU in every forward (24 ms a micro-batch in the 1.5B update's
    profile, benchmarks/results/long_tail/update_host.txt), so the host's lead over the GPU was lost at every
    micro-batch. The attention function takes causality from `cu_seq_lens_q` and never reads it; pass it only where
    `mask_unread(model)`."""
    return torch.empty(1, 1, 0, 0)


def mask_unread(model) -> bool:
    """True where nothing in a packed forward of `model` reads its attention mask: its attention is this module's
    function (HF's own sdpa / eager build the packed row's mask from it), and its config does not ask HF for router
    logits (HF's MoE loss reads the mask)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == VARLEN_ATTN and \
        not getattr(config, "output_router_logits", False)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             sliding_window=None, **kwargs):
    """query [1, H, T, D], key/value [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None and attention_mask is not None and attention_mask.numel() == 0:
        raise ValueError("packed attention got no_mask() without cu_seq_lens_q: a packed forward must pass both")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got batch {query.shape[0]}")
    span = kwargs.get("max_key_span")   # the longest row a token attends over, where the caller knows it
    if sliding_window is not None and (span is None or span > sliding_window):
        raise ValueError(f"packed attention does not implement sliding_window={sliding_window} (rows of "
                         f"{'unknown length' if span is None else span} tokens); set use_remove_padding=false for "
                         "sliding-window models, or keep prompt + response within the window")
    sp = kwargs.get("sp_group")
    if sp is not None:  # [T_loc tokens, all heads] -> [all tokens, heads / P]
        query, key, value = ulysses_qkv(query, key, value, sp)
    shared = kwargs.get("shared_prompts")
    flash = kwargs.get("flash_segments")
    if flash is not None and flash_usable(query):
        out = flash_varlen_attention(query, key, value, flash, scaling)
    elif query.is_cuda and not torch.compiler.is_compiling() and query.shape[2] >= FLEX_MIN_TOKENS:
        out = _flex_attention(query, key, value, cu, scaling, shared)
    else:
        out = _sdpa_block_diagonal(query, key, value, cu, scaling, shared)
    out = out.transpose(1, 2)
    if sp is not None:
        out = ulysses_out(out, sp)
    return out.contiguous(), None


def _varlen_mask(*args, attention_mask=None, **kwargs):
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_varlen_attention() -> str:
    """Register the packed attention (idempotent) and return its name for `set_attn_implementation`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTN, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_ATTN, _varlen_mask)
    return VARLEN_ATTN
