"""FlashAttention's variable-length kernel over a packed row (torch.nn.attention.varlen), shared prompts included.

A packed row is a list of documents (training/packing.py). FlashAttention's varlen kernel takes query segments and,
for each, a key segment that is contiguous in its key tensor, with a causal mask aligned to the key segment's end.
- Unshared rows: one segment per document, keys = queries.
- Shared prompts: a document is [prompt, response_1, ..., response_n]; the prompt is one query segment over its own
  keys, each response one query segment whose keys are its document's prompt followed by itself. Those keys are
  gathered into a key tensor of sum(P + R_i) tokens (`kv_index`): the prompt's K/V are copied once per response,
  which costs (n·P) rows of K/V per document, small beside the attention and MLP work (and with grouped-query
  attention K/V have few heads). The causal mask aligned at the end of the key segment lets response token i see
  the whole prompt and its own first i + 1 tokens: exactly the shared-prompt mask.
The layout is index arithmetic with data-dependent sizes, made on the host with the packing (no device sync) and
moved to the device with it.

Choices:
- The kernel runs where it can (models/varlen_attention.py: CUDA, bf16/fp16, head dim <= 256, torch's varlen_attn
  present); otherwise the caller keeps its FlexAttention / SDPA path. `HYBRIDRL_PACKED_ATTENTION=flex` forces the
  Flex path (for A/B runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridrl.models.varlen_attention import flash_available, varlen_causal_attention
from hybridrl.training.transfer import to_device

__all__ = ["FlashSegments", "flash_segments", "flash_usable", "flash_varlen_attention"]


@dataclass
class FlashSegments:
    cu_q: torch.Tensor            # [S+1] int32: query segments over the packed row
    cu_k: torch.Tensor            # [S+1] int32: their key segments over the (gathered) keys
    max_q: int
    max_k: int
    kv_index: torch.Tensor | None  # [sum of key lengths] long: packed position of each key; None: keys = queries

    def to(self, device) -> FlashSegments:
        idx = None if self.kv_index is None else to_device(self.kv_index, device)
        return FlashSegments(to_device(self.cu_q, device), to_device(self.cu_k, device), self.max_q, self.max_k, idx)


def _cu(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Concatenation of arange(start, start + length) for each (start, length)."""
    total = int(lengths.sum())
    offsets = torch.cumsum(lengths, 0) - lengths
    return (torch.arange(total, device=lengths.device) - torch.repeat_interleave(offsets, lengths, output_size=total)
            + torch.repeat_interleave(starts, lengths, output_size=total))


def flash_segments(cu_seqlens: torch.Tensor, segment: torch.Tensor | None = None,
                   is_prompt: torch.Tensor | None = None) -> FlashSegments:
    """The varlen kernel's segments for a packed row of documents `cu_seqlens`; with shared prompts, `segment` [T]
    (the prompt's or the response's id of each packed token, contiguous runs) and `is_prompt` [T]."""
    doc_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if segment is None:
        max_len = int(doc_lens.max()) if doc_lens.numel() else 0
        cu = cu_seqlens.to(torch.int32)
        return FlashSegments(cu, cu, max_len, max_len, None)
    total = segment.numel()
    change = torch.ones(total, dtype=torch.bool, device=segment.device)
    change[1:] = segment[1:] != segment[:-1]
    run_start = change.nonzero(as_tuple=True)[0]
    run_len = torch.diff(run_start, append=torch.tensor([total], device=segment.device))
    run_prompt = is_prompt[run_start]
    # each run's document, and that document's prompt run (its first run, when it is a prompt)
    doc = torch.searchsorted(cu_seqlens[1:].long(), run_start, right=True)
    doc_start = cu_seqlens[:-1].long()[doc]
    first_run = torch.searchsorted(run_start, doc_start)
    prompt_len = torch.where(run_prompt[first_run], run_len[first_run], 0)
    # keys per run: [its document's prompt (responses only)] + [itself]
    extra = torch.where(run_prompt, 0, prompt_len)
    starts = torch.stack([doc_start, run_start], 1).reshape(-1)
    lengths = torch.stack([extra, run_len], 1).reshape(-1)
    key_len = extra + run_len
    return FlashSegments(_cu(run_len), _cu(key_len), int(run_len.max()), int(key_len.max()),
                         _ranges(starts, lengths))


def flash_usable(query: torch.Tensor) -> bool:
    return flash_available(query.device, query.dtype, query.shape[-1])


def flash_varlen_attention(query, key, value, seg: FlashSegments, scaling) -> torch.Tensor:
    """query [1, H, T, D], key/value [1, Hkv, T, D] -> [1, H, T, D] (the Flex path's layout)."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))       # [T, heads, D]
    if seg.kv_index is not None:
        k, v = k.index_select(0, seg.kv_index), v.index_select(0, seg.kv_index)
    out = varlen_causal_attention(q, k, v, seg.cu_q, seg.cu_k, seg.max_q, seg.max_k, scaling)
    return out.transpose(0, 1).unsqueeze(0)
