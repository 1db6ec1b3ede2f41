"""Micro-batching and gradient-accumulation weights shared by the actor, the critic and the SFT trainer.

Choice: each micro-batch's loss is multiplied by its share of the mini-batch's normaliser (tokens for
`token-mean`, non-empty sequences for the seq-mean modes, 1 for `seq-mean-token-sum-norm`, whose normaliser
is the constant R), so the accumulated gradient equals the gradient of the loss aggregated over the whole
mini-batch on this rank, for any micro-batch size or dynamic split (verl divides by the micro-batch count,
which is exact only when all micro-batches hold the same number of tokens). Across ranks FSDP averages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridrl.protocol import DataProto
from hybridrl.seeding import derive_seed
from hybridrl.training.packing import prompt_groups
from hybridrl.training.token_bins import rearrange_micro_batches, rearrange_prompt_groups

__all__ = ["UpdateBatches", "make_micro_batches", "sp_size_of", "iter_mini_batches", "loss_scale", "loss_scales", "normaliser",
           "normaliser_count"]


@dataclass(frozen=True)
class UpdateBatches:
    """How an update splits this rank's rows, sizes the run plan derives (never the config's global ones): mini-batches
    of `mini_batch_rows` rows (verl's ppo_mini_batch_size prompts x rollout.n / data-parallel size), each one optimizer
    step, run in micro-batches of `micro_rows` rows or, with `micro_rows` None (use_dynamic_bsz), of at most
    `max_tokens` tokens; with `unshard_once` every FSDP block stays all-gathered for a whole mini-batch."""

    mini_batch_rows: int
    micro_rows: int | None
    max_tokens: int | None
    unshard_once: bool = False

    def __post_init__(self):
        if self.mini_batch_rows <= 0:
            raise ValueError(f"mini_batch_rows={self.mini_batch_rows} (rows per rank) must be > 0")
        if self.micro_rows is None and self.max_tokens is None:
            raise ValueError("UpdateBatches: micro_rows or max_tokens (token-budgeted micro-batches) must be set")

    @property
    def dynamic(self) -> bool:
        """Micro-batches by token budget (use_dynamic_bsz), not by rows."""
        return self.micro_rows is None


def normaliser_count(response_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """The normaliser as a 0-d tensor on the mask's device (no host sync)."""
    if loss_agg_mode == "token-mean":
        return response_mask.sum().float()
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return (response_mask.sum(-1) > 0).sum().float()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return torch.ones((), device=response_mask.device)
    raise ValueError(f"loss_agg_mode={loss_agg_mode!r} is not supported")


def normaliser(response_mask: torch.Tensor, loss_agg_mode: str) -> float:
    return float(normaliser_count(response_mask, loss_agg_mode).item())


def loss_scale(micro_mask: torch.Tensor, mini_norm: float, loss_agg_mode: str) -> float:
    """Factor for a micro-batch's aggregated loss so that the sum over micro-batches is the mini-batch loss."""
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return 1.0
    return normaliser(micro_mask, loss_agg_mode) / mini_norm if mini_norm > 0 else 0.0


def loss_scales(micros: list[DataProto], loss_agg_mode: str) -> list[float]:
    """`loss_scale` of every micro-batch of a mini-batch (the micro-batches together), read from the device in
    one copy: a host sync per micro-batch would stop the host from queueing the next micro-batch's kernels while
    the GPU runs this one."""
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return [1.0] * len(micros)
    counts = torch.stack([normaliser_count(m.batch["response_mask"], loss_agg_mode) for m in micros]).tolist()
    total = sum(counts)
    return [c / total if total > 0 else 0.0 for c in counts]


def sp_size_of(sp_group) -> int:
    """The Ulysses group's size (1 without one)."""
    import torch.distributed as dist

    return 1 if sp_group is None else dist.get_world_size(sp_group)


def make_micro_batches(data: DataProto, use_dynamic_bsz: bool, micro_batch_size: int | None,
                       max_token_len: int | None, size_key: str = "ppo_micro_batch_size_per_gpu",
                       token_key: str = "ppo_max_token_len_per_gpu", share_prompts: bool = False, sp_size: int = 1):
    """Returns (micro-batches, bins): bins are the row indices of each micro-batch (dynamic bsz) or None.
    share_prompts: dynamic micro-batches keep the rows of a prompt together and count its tokens once
    (`rearrange_prompt_groups`), as the shared-prompt forward runs them. `max_token_len` is per GPU, as verl's
    *_max_token_len_per_gpu: with Ulysses (`sp_size` ranks holding one micro-batch, each running 1/sp_size of its
    tokens) a micro-batch holds max_token_len x sp_size tokens, as in verl's dp_actor / dp_critic."""
    if use_dynamic_bsz:
        if max_token_len is None:
            raise ValueError(f"use_dynamic_bsz=true needs {token_key}")
        if sp_size > 1:
            max_token_len, token_key = int(max_token_len) * sp_size, f"{token_key} x ulysses size {sp_size}"
        mask = data.batch["attention_mask"]
        if share_prompts:
            b = data.batch
            prompt_len = mask.shape[1] - b["responses"].shape[1]
            group, _ = prompt_groups(b["input_ids"], mask, b["position_ids"], prompt_len)
            members = [[] for _ in range(int(group.max()) + 1)]
            for row, g in enumerate(group.tolist()):
                members[g].append(row)
            prompt_lens = mask[:, :prompt_len].sum(-1).tolist()
            bins = rearrange_prompt_groups(members, [prompt_lens[m[0]] for m in members],
                                           mask[:, prompt_len:].sum(-1).tolist(), int(max_token_len), key=token_key)
        else:
            bins = rearrange_micro_batches(mask.sum(-1).tolist(), int(max_token_len), key=token_key)
        return [data.select_idxs(torch.tensor(b, dtype=torch.long)) for b in bins], bins
    if micro_batch_size is None or int(micro_batch_size) <= 0:
        raise ValueError(f"{size_key}={micro_batch_size} must be a positive integer")
    return data.split(int(micro_batch_size)), None


def iter_mini_batches(data: DataProto, mini_batch_rows: int, epochs: int, shuffle: bool):
    """`epochs` passes over `data` in mini-batches of `mini_batch_rows` rows (per rank), reshuffled each epoch with
    `shuffle` (the section's ppo_epochs and shuffle). The order is seeded by the step's `meta_info["shuffle_seed"]`
    (the driver derives it from trainer.seed and the step, hybridrl/seeding.py), so steps differ and a resumed run
    replays the same orders. Shared by the actor and the critic."""
    seed = int(data.meta_info.get("shuffle_seed", 0))
    for epoch in range(epochs):
        epoch_data = data
        if shuffle:
            g = torch.Generator().manual_seed(derive_seed(seed, epoch))
            epoch_data = data.select_idxs(torch.randperm(len(data), generator=g))
        yield from epoch_data.split(mini_batch_rows)
