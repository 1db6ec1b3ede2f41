"""Sequence packing (`use_remove_padding`): the valid tokens of a micro-batch's padded rows as one packed row.

Shapes: B rows, S padded length, T packed (valid) tokens, D documents.

Choices:
- Packing keeps only the valid tokens of a micro-batch, in row order, in one row [1, T]; position ids are the
  batch's own (they restart per sequence: cumsum(mask) - 1), and the documents' boundaries travel as `cu_seqlens`
  (the packed forward, training/response_forward.py, hands them to the model as FlashAttention's
  `cu_seq_lens_q/k` kwargs, which HF models pass down to the attention function, training/packed_attention.py).
- Shared prompts (`actor.use_prefix_grouper`, GRPO's n samples of a prompt in one micro-batch): rows whose prompt
  columns are equal form one document, the prompt packed once and then each row's response; `SharedPrompts`
  records per packed token its segment and whether it is a prompt token, which the attention uses to let a
  response token see its document's prompt and its own response only — (P + n·R) tokens instead of n·(P + R).
- The layout is index arithmetic with data-dependent sizes: it is made where the inputs are (the host, for rows
  from the controller) and moved with `PackedInputs.to`, so the host never waits for the GPU's queue to drain.
- Per-token data laid out like the model's input tokens (`tokens_as_input`: the padded rows flattened, or the
  packed row with a shared prompt's values from its group's first row) is what the MoE routing taps read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridrl.training.flash_segments import FlashSegments, flash_segments
from hybridrl.training.transfer import to_device

__all__ = ["PackedInputs", "SharedPrompts", "pack_inputs", "prompt_groups", "tokens_as_input"]


@dataclass
class SharedPrompts:
    """The layout of a packed row in which each prompt appears once, followed by the responses of every row that
    has it: per packed token its segment (its group's prompt, or its row's response) and whether it is a prompt
    token (one that every response of its document attends to)."""
    segment: torch.Tensor        # [T] long
    is_prompt: torch.Tensor      # [T] bool


@dataclass
class PackedInputs:
    input_ids: torch.Tensor      # [1, T]
    position_ids: torch.Tensor   # [1, T]
    cu_seqlens: torch.Tensor     # [D+1] int32: documents (a row each; a prompt group each with shared prompts)
    max_seqlen: int
    packed_of_flat: torch.Tensor  # [B*S] packed position of each padded position (-1: padding); the positions of
                                  # a shared prompt's rows all map to its one copy
    shared: SharedPrompts | None = None
    flash: FlashSegments | None = None   # the same layout as FlashAttention's varlen kernel takes it

    def to(self, device) -> PackedInputs:
        shared = None if self.shared is None else SharedPrompts(to_device(self.shared.segment, device),
                                                                to_device(self.shared.is_prompt, device))
        return PackedInputs(to_device(self.input_ids, device), to_device(self.position_ids, device),
                            to_device(self.cu_seqlens, device), self.max_seqlen,
                            to_device(self.packed_of_flat, device), shared,
                            None if self.flash is None else self.flash.to(device))


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                  prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose first prompt_len columns (tokens, padding and positions) are equal share a prompt:
    ([B] group of each row, numbered in the order of their first rows; [B] that first row)."""
    bsz = input_ids.shape[0]
    prompt_mask = attention_mask[:, :prompt_len].bool()
    key = torch.cat([input_ids[:, :prompt_len].masked_fill(~prompt_mask, -1),
                     position_ids[:, :prompt_len].masked_fill(~prompt_mask, -1)], 1)
    _, group = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(bsz, device=input_ids.device)
    first = torch.full((int(group.max()) + 1,), bsz, device=input_ids.device).scatter_reduce(0, group, rows, "amin")
    return torch.argsort(torch.argsort(first))[group], first[group]


def pack_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                prompt_len: int | None = None) -> PackedInputs:
    """The valid tokens of [B, S] padded rows as one packed row. prompt_len: share prompts — rows whose first
    prompt_len columns (tokens, padding and positions) are equal form one document, their prompt once, then each
    row's response in row order; documents in the order of their first row (`prompt_groups`)."""
    mask = attention_mask.bool()
    bsz, seq_len = mask.shape
    dev = input_ids.device
    if prompt_len is None:
        keep, doc_of_row, leader = mask, torch.arange(bsz, device=dev), None
    else:
        doc_of_row, leader = prompt_groups(input_ids, attention_mask, position_ids, prompt_len)
        rows = torch.arange(bsz, device=dev)
        cols = torch.arange(seq_len, device=dev)
        keep = mask & ((cols >= prompt_len)[None, :] | (rows == leader)[:, None])
    flat = keep.reshape(-1).nonzero(as_tuple=True)[0]
    row, col = flat // seq_len, flat % seq_len
    if prompt_len is not None:  # document by document: its prompt, then its rows' responses
        span = bsz * seq_len
        flat = flat[torch.argsort(doc_of_row[row] * 2 * span + (col >= prompt_len) * span + flat)]
        row, col = flat // seq_len, flat % seq_len
    total = flat.numel()
    packed_of_flat = torch.full((bsz * seq_len,), -1, dtype=torch.long, device=dev)
    packed_of_flat[flat] = torch.arange(total, device=dev)
    shared = None
    if prompt_len is not None:
        by_row = packed_of_flat.view(bsz, seq_len)
        by_row[:, :prompt_len] = by_row[leader, :prompt_len]
        is_prompt = col < prompt_len
        shared = SharedPrompts(torch.where(is_prompt, bsz + doc_of_row[row], row), is_prompt)
    lens = torch.bincount(doc_of_row[row], minlength=int(doc_of_row.max()) + 1 if bsz else 0)
    cu = F.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    flash = flash_segments(cu, *((shared.segment, shared.is_prompt) if shared is not None else ()))
    return PackedInputs(input_ids.reshape(-1)[flat].unsqueeze(0), position_ids.reshape(-1)[flat].unsqueeze(0),
                        cu, int(lens.max().item()) if lens.numel() else 0, packed_of_flat, shared, flash)


def tokens_as_input(values: torch.Tensor, packed: PackedInputs | None) -> torch.Tensor:
    """[B, S, ...] per-token values in the order the model sees the tokens: [B*S, ...] (padded rows) or [T, ...]
    (the packed row; a shared prompt's position takes its group's first row's value)."""
    flat_values = values.reshape(-1, *values.shape[2:])
    if packed is None:
        return flat_values
    where = packed.packed_of_flat.to(values.device)
    kept = where >= 0
    flat = torch.arange(where.numel(), device=values.device)[kept]
    first = torch.full((packed.input_ids.shape[1],), where.numel(), dtype=torch.long, device=values.device)
    first = first.scatter_reduce(0, where[kept], flat, "amin")
    return flat_values[first]
