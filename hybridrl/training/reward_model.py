"""Sequence scores of a HF `...ForSequenceClassification` reward model (num_labels=1), plain or FSDP2-sharded.

Choices:
- The score of a sequence is the score head's output at its last valid token, found from the attention mask
  (rewards/token_level.last_valid_index), so left, right or no padding give the same numbers. HF's own pooling
  looks for the last token that is not `pad_token_id` instead, which is wrong whenever the pad id also ends a
  valid sequence (pad = eos, as many reward models set it): the per-token head output is taken from a forward
  hook on the head (`score`, as every HF decoder ...ForSequenceClassification names it) and pooled here. The
  model runs its full forward, so FSDP's root unshards the head as usual.
- Sequences arrive as id lists; each micro-batch is right-padded to its own longest row, and position ids count
  valid tokens only. Micro-batches of the run plan's rows in input order, or (use_dynamic_bsz) of sequences sorted
  by length within a token budget counted padded, so little of a forward is padding. Scores come back in fp32 on
  the CPU in input order.
- A pass of several micro-batches may keep the FSDP blocks unsharded throughout (`unshard_once`, the run plan's
  choice), as the log-prob passes do (training/fsdp.py keep_unsharded).
"""

from __future__ import annotations

import torch

from hybridrl.rewards.token_level import last_valid_index
from hybridrl.training.fsdp import keep_unsharded, should_keep_unsharded
from hybridrl.training.token_bins import padded_length_bins, restore_order

__all__ = ["last_token_scores", "score_head", "score_batch", "score_sequences"]


def score_head(module: torch.nn.Module) -> torch.nn.Module:
    head = getattr(module, "score", None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
        raise ValueError(f"reward_model.model.path: {type(module).__name__} has no one-output `score` head; the reward "
                         "model must be a HF decoder ...ForSequenceClassification with num_labels=1")
    return head


@torch.no_grad()
def score_batch(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] ids and 0/1 mask (any padding side) -> [B] fp32 scores at each row's last valid token."""
    return last_token_scores(module, input_ids, attention_mask)


def last_token_scores(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """score_batch with autograd on: what training a reward model (a loss on these scores) differentiates."""
    captured: list[torch.Tensor] = []
    hook = score_head(module).register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    finally:
        hook.remove()
    per_token = captured[-1][..., 0].float()                                         # [B, L]
    rows = torch.arange(input_ids.shape[0], device=per_token.device)
    return per_token[rows, last_valid_index(attention_mask).to(per_token.device)]


def score_sequences(module: torch.nn.Module, sequences: list[list[int]], rows: int | None, pad_token_id: int, device,
                    unshard_once: bool = False, *, max_tokens: int | None = None,
                    key: str = "reward_model.forward_max_token_len_per_gpu") -> torch.Tensor:
    """[len(sequences)] fp32 scores on the CPU, in input order; micro-batches of `rows` sequences, or (rows None) of
    length-sorted sequences within `max_tokens` counted padded (token_bins.padded_length_bins; `key` names that
    budget in its errors)."""
    if (rows is None) == (max_tokens is None):
        raise ValueError(f"score_sequences: give rows or max_tokens, not {rows=} and {max_tokens=}")
    if rows is not None and rows < 1:
        raise ValueError(f"reward_model.micro_batch_size_per_gpu={rows}: must be >= 1")
    if any(len(s) == 0 for s in sequences):
        raise ValueError("a reward-model input has no tokens; every sample needs at least its prompt")
    if not sequences:
        return torch.zeros(0)
    module.eval()
    if rows is not None:
        bins = None
        chunks = [sequences[i:i + rows] for i in range(0, len(sequences), rows)]
    else:
        bins = padded_length_bins([len(s) for s in sequences], max_tokens, key=key)
        chunks = [[sequences[i] for i in b] for b in bins]
    once = should_keep_unsharded(module, unshard_once, len(chunks), device)
    scores = []
    with keep_unsharded(module, once):
        for chunk in chunks:
            width = max(map(len, chunk))
            ids = torch.tensor([s + [pad_token_id] * (width - len(s)) for s in chunk], device=device)
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in chunk], device=device)
            scores.append(score_batch(module, ids, mask).cpu())
    return restore_order(scores, bins)
