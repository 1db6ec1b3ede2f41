"""Small pieces the model-based rewards share: a per-sample score as a token-level reward, the text of a chat, the
samples' ground truths.

verl's convention: a sequence score is the reward of the last valid response token, every other token gets 0.
A response with no valid token cannot hold it there; its score goes to position 0 (the reward manager counts
such responses in `reward/empty_responses`).
"""

from __future__ import annotations

import torch

__all__ = ["ground_truths", "last_user_message", "last_valid_index", "place_at_last_token", "score_metrics"]


def place_at_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """scores [B] -> (token-level rewards [B, R] float32 on the CPU, number of empty responses)."""
    mask = response_mask.bool().cpu()
    last = last_valid_index(mask)
    out = torch.zeros(mask.shape, dtype=torch.float32)
    out[torch.arange(len(scores)), last] = scores.float().cpu()
    return out, int((~mask.any(-1)).sum())


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """[B, L] 0/1 mask -> [B] index of each row's rightmost 1 (0 for a row without one), whatever the padding
    side (and with masked tokens inside a row, as a multi-turn response has)."""
    positions = torch.arange(mask.shape[-1], device=mask.device)
    return (positions * mask.long()).argmax(-1)


def last_user_message(chat) -> str:
    """The content of the last user turn of a chat (a list of {role, content}); a plain string is itself."""
    if isinstance(chat, str):
        return chat
    users = [m["content"] for m in chat if m["role"] == "user"]
    if not users:
        raise ValueError(f"the prompt chat has no user message: {list(chat)!r}")
    return str(users[-1])


def score_metrics(scores: torch.Tensor) -> dict[str, float]:
    """`reward_model/score/{mean,max,min}` of one batch (verl's critic/score/* shape)."""
    s = scores.float()
    return {"reward_model/score/mean": s.mean().item(), "reward_model/score/max": s.max().item(),
            "reward_model/score/min": s.min().item()}


def ground_truths(non_tensor_batch: dict, n: int) -> list:
    """Each of the `n` samples' `reward_model.ground_truth` (verl's field), None where it has none."""
    infos = non_tensor_batch.get("reward_model")
    if infos is None:
        return [None] * n
    return [info.get("ground_truth") if isinstance(info, dict) else None for info in infos]
