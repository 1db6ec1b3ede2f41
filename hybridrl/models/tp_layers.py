"""Tensor-parallel layers for the rollout decoder.

Choices:
- Every layer takes its process group EXPLICITLY (`tp_group=None` means no TP). Nothing here touches
  the global default group, so the rollout mesh ('dp','infer_tp') can coexist with the FSDP mesh.
- Every TP module has `shard_spec(param_name, shard_id) -> (dim, start, length[, blocks]) | None` and
  `load(param_name, tensor, shard_id)` (methods on the module, not attributes on parameters, which
  `to_empty` replaces on every wake-up). The loader accepts either the full HF tensor (and narrows
  it to this rank's shard) or exactly the slice `shard_spec` named (so a resharder can send only
  what this rank needs). Fused projections (q/k/v, gate/up) take each part by `shard_id` and copy it
  into its offset: fusion happens on arrival, no full-model staging. A 4th entry `blocks` names a slice
  of a tensor fused at the source (HF's [E, 2I, H] gate|up experts): `dim` seen as `blocks` equal blocks
  and the same range taken from each (`narrow_spec`).
- K/V heads are replicated when tp > num_kv_heads (tp must be a multiple of them), as in vLLM.
- The vocab is split in contiguous ranges of ceil(V/tp) rows; the last rank's tail rows are zero
  padding, masked in the embedding and cut from the gathered logits.
- Collectives: all_reduce / all_gather(list) only, which both NCCL and gloo support.

Shape legend: T tokens, H hidden, V vocab, I intermediate.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

ShardSpec = tuple[int, int, int] | tuple[int, int, int, int]  # (dim, start, length[, blocks])


def tp_rank_size(tp_group) -> tuple[int, int]:
    if tp_group is None:
        return 0, 1
    return dist.get_rank(tp_group), dist.get_world_size(tp_group)


def narrow_spec(tensor: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    """The slice `spec` names in a full tensor: [start, start+length) of `dim`, or, with a 4th entry `blocks`, that
    range taken from each of `blocks` equal consecutive blocks of `dim` and concatenated (a fused gate|up tensor
    whose rank slice is some gate rows and the same up rows)."""
    dim, start, length, *rest = spec
    blocks = rest[0] if rest else 1
    if blocks == 1:
        return tensor.narrow(dim, start, length)
    return tensor.unflatten(dim, (blocks, -1)).narrow(dim + 1, start, length).flatten(dim, dim + 1)


def copy_shard(dst: torch.Tensor, tensor: torch.Tensor, spec: ShardSpec | None, name: str) -> None:
    """Copy `tensor` (full or already-sliced per `spec`) into `dst` (a parameter or a view of one)."""
    if spec is not None:
        dim, start, length, *rest = spec
        sliced = length * (rest[0] if rest else 1)
        if tensor.shape[dim] != sliced:
            tensor = narrow_spec(tensor, spec)
        if dim == 0 and length < dst.shape[0]:  # vocab tail on the last rank
            dst[length:].zero_()
            dst = dst[:length]
    if tuple(tensor.shape) != tuple(dst.shape):
        raise ValueError(f"load_weights: {name} has shape {tuple(tensor.shape)}, expected the full HF tensor "
                         f"or the slice given by weight_shard_spec (shard shape {tuple(dst.shape)})")
    dst.copy_(tensor.to(dtype=dst.dtype, device=dst.device))


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W split along its output rows. Fused variants list `parts`: shard_id -> (full rows,
    local rows, local offset, rank's start row in the full tensor)."""

    def __init__(self, in_features: int, parts: dict, bias: bool, tp_group=None):
        super().__init__()
        self.tp_group = tp_group
        self.parts = parts
        out_local = sum(p[1] for p in parts.values())
        self.weight = nn.Parameter(torch.empty(out_local, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_local), requires_grad=False) if bias else None

    def shard_spec(self, param_name, shard_id) -> ShardSpec | None:
        full, local, _, start = self.parts[shard_id]
        return None if local == full else (0, start, local)

    def load(self, param_name: str, tensor: torch.Tensor, shard_id=None) -> None:
        param = getattr(self, param_name)
        full, local, offset, _ = self.parts[shard_id]
        copy_shard(param.data.narrow(0, offset, local), tensor, self.shard_spec(param_name, shard_id),
                   f"column-parallel {param_name} part {shard_id!r}")

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def column_parts(full_sizes: dict, tp_group, replicate_groups: dict | None = None) -> dict:
    """Build `parts` for ColumnParallelLinear. `replicate_groups[sid] = unit` splits that part in units of
    `unit` rows (a head), replicating units when there are fewer units than ranks."""
    rank, size = tp_rank_size(tp_group)
    parts, offset = {}, 0
    for sid, full in full_sizes.items():
        unit = (replicate_groups or {}).get(sid, 1)
        units = full // unit
        if units >= size:
            if units % size:
                raise ValueError(f"tensor_model_parallel_size={size} must divide {units} (part {sid!r})")
            local = full // size
            start = rank * local
        else:
            if size % units:
                raise ValueError(f"tensor_model_parallel_size={size} must be a multiple of {units} kv heads")
            local = unit
            start = (rank // (size // units)) * unit
        parts[sid] = (full, local, offset, start)
        offset += local
    return parts


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local W_local^T) + b, W split along its input columns."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp_group=None):
        super().__init__()
        self.tp_group = tp_group
        rank, size = tp_rank_size(tp_group)
        if in_features % size:
            raise ValueError(f"tensor_model_parallel_size={size} must divide in_features={in_features}")
        self.in_local = in_features // size
        self.start = rank * self.in_local
        self.full_in = in_features
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def shard_spec(self, param_name, shard_id) -> ShardSpec | None:
        if param_name == "bias" or self.in_local == self.full_in:
            return None
        return (1, self.start, self.in_local)

    def load(self, param_name, tensor, shard_id=None):
        param = getattr(self, param_name)
        copy_shard(param.data, tensor, self.shard_spec(param_name, shard_id), f"row-parallel {param_name}")

    def forward(self, x):
        return self.reduce(F.linear(x, self.weight))

    def reduce(self, y_local):
        """This rank's x_local W_local^T (computed here or by a fused kernel) -> the layer's output."""
        if self.tp_group is not None:
            dist.all_reduce(y_local, group=self.tp_group)
        return y_local if self.bias is None else y_local + self.bias


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, tp_group=None):
        super().__init__()
        self.tp_group = tp_group
        rank, size = tp_rank_size(tp_group)
        self.vocab_size = vocab_size
        self.local = -(-vocab_size // size)
        self.start = rank * self.local
        self.length = max(0, min(self.local, vocab_size - self.start))
        self.weight = nn.Parameter(torch.empty(self.local, hidden), requires_grad=False)

    def shard_spec(self, param_name, shard_id) -> ShardSpec | None:
        return None if self.local == self.vocab_size else (0, self.start, self.length)

    def load(self, param_name, tensor, shard_id=None):
        copy_shard(self.weight.data, tensor, self.shard_spec(param_name, shard_id), "vocab-parallel weight")

    def forward(self, ids_T):
        if self.tp_group is None:
            return F.embedding(ids_T, self.weight)
        local = ids_T - self.start
        mine = (local >= 0) & (local < self.length)
        out_TH = F.embedding(local.clamp(0, self.local - 1), self.weight) * mine.unsqueeze(-1)
        dist.all_reduce(out_TH, group=self.tp_group)
        return out_TH


class ParallelLMHead(VocabParallelEmbedding):
    """logits = h W^T over this rank's vocab range, all-gathered and cut to the true vocab size."""

    def forward(self, h_TH):
        logits = F.linear(h_TH, self.weight)
        if self.tp_group is not None:
            parts = [torch.empty_like(logits) for _ in range(dist.get_world_size(self.tp_group))]
            dist.all_gather(parts, logits.contiguous(), group=self.tp_group)
            logits = torch.cat(parts, dim=-1)
        return logits[..., : self.vocab_size]
