"""Ulysses sequence parallelism for training forwards (`actor.ulysses_sequence_parallel_size`, DeepSpeed-Ulysses).

Shapes: P ranks in the SP group, T packed tokens of a micro-batch (padded to a multiple of P), T_loc = T / P,
H query heads, Hkv kv heads, D head dim, K rows kept from the head, C head width.

Choices:
- Every rank of an SP group holds the same micro-batch. After packing, rank r runs the model on tokens
  [r*T_loc, (r+1)*T_loc): embeddings, norms, MLPs and the head see 1/P of the tokens (and of the activations).
  The padding that makes T divisible by P is its own document, so no real token attends to it.
- Attention needs whole sequences: one all-to-all turns q/k/v from [T_loc tokens, all heads] into [all T tokens,
  H/P heads] and one turns the output back (`seq_all_to_all`, exact, its backward is the inverse all-to-all).
  Query heads must divide by P; kv heads that do not are repeated to H first (GQA groups stay aligned).
- Head outputs: each rank keeps its rows (the positions that predict response tokens in its slice), reduces
  them with the caller's row function (the actor: log-prob and entropy, 2 numbers instead of a vocabulary's
  width) and `gather_rows` all-gathers them in rank order, so every SP rank computes the same loss. Its backward sums the
  group's gradients and keeps this rank's rows: P identical losses give P x the gradient on every rank, and
  FSDP's average over all dp x P ranks then equals the average over dp of the full-sequence gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["SequenceParallel", "seq_all_to_all", "gather_rows", "ulysses_qkv", "ulysses_out"]


@dataclass(frozen=True)
class SequenceParallel:
    group: dist.ProcessGroup
    size: int
    rank: int

    @classmethod
    def from_group(cls, group) -> SequenceParallel | None:
        """None for no group or a group of one rank (the plain path)."""
        if group is None or dist.get_world_size(group) == 1:
            return None
        return cls(group, dist.get_world_size(group), dist.get_rank(group))


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()  # chunk p goes to rank p
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)  # chunk p came from rank p


class _SeqAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def seq_all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split `scatter_dim` over the group's ranks and concatenate what they send along `gather_dim`."""
    return _SeqAllToAll.apply(x, scatter_dim, gather_dim, group)


def ulysses_qkv(query, key, value, sp: SequenceParallel):
    """q [1, H, T_loc, D], k/v [1, Hkv, T_loc, D] -> the same with H/P (Hkv/P) heads and all T tokens."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % sp.size:
        raise ValueError(f"ulysses_sequence_parallel_size={sp.size} must divide the model's "
                         f"num_attention_heads={heads}")
    if kv_heads % sp.size:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    return tuple(seq_all_to_all(x, 1, 2, sp.group) for x in (query, key, value))


def ulysses_out(out: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """attention output [1, T, H/P, D] -> [1, T_loc, H, D]."""
    return seq_all_to_all(out, 1, 2, sp.group)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, sizes, group, rank):
        ctx.sizes, ctx.group, ctx.rank = sizes, group, rank
        width = max(sizes)
        padded = rows.new_zeros((width, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start: start + ctx.sizes[ctx.rank]], None, None, None


def gather_rows(rows: torch.Tensor, sizes: list[int], sp: SequenceParallel) -> torch.Tensor:
    """Concatenate every SP rank's rows (rank r holds sizes[r] rows) in rank order, on every rank."""
    if rows.shape[0] != sizes[sp.rank]:
        raise ValueError(f"gather_rows: rank {sp.rank} holds {rows.shape[0]} rows, sizes say {sizes[sp.rank]}")
    return _GatherRows.apply(rows, list(sizes), sp.group, sp.rank)
