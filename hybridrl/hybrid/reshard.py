"""Resharding FSDP → TP: stream the actor's FSDP2 shards into the rollout engine, tensor by tensor.

Two strategies, chosen per tensor:
  slice  — each rank receives ONLY the piece of each tensor its TP shard needs, straight from the FSDP ranks that hold
           it (one all_to_all_single per tensor inside the FSDP group). No rank ever materialises a full tensor, and
           the bytes a rank receives are ~1/tp of the model instead of (W-1)/W of it.
  gather — `DTensor.full_tensor()` (an all-gather) and let the engine slice. Used for parameters that are not
           DTensors, when the backend is not one all_to_all supports, or by request. A shard that is already the
           whole tensor (a group of one rank) is passed on as it is: DTensor's redistribution machinery cost more
           host time than the rest of the reshard (one H200, 1.5B: resharding took 0.11-0.14 s for ~2 ms of copies).
A tensor the engine wants whole (no slice spec: norms, biases of row-parallel layers) stays on the slice path and
simply arrives whole through the same all_to_all_single.

Shapes legend: FSDP2 shards every parameter on dim 0 over the FSDP group with torch.chunk semantics (rank g holds
rows [g*ceil(N/S), min(N, (g+1)*ceil(N/S))) ); a TP slice is a box (dim d, [start, start+length)), or, with a 4th
entry `blocks` (d >= 1 only), that range taken from each of `blocks` equal blocks of dim d (the gate and up halves of
HF's fused [E, 2I, H] experts tensor).
Everything is cast to the engine dtype BEFORE communication, so bf16 rollout moves half the bytes of fp32 masters.
With LoRA (training/lora.py) the engine gets merged weights under their HF names: each rank merges its own rows
of a targeted weight (W + scaling·B·A) before the cast, so the exchange is the same as without adapters.
Borrowing (`borrow=True`, the plan's `rollout.borrow_weights`): a tensor this rank already holds whole, in the
engine's dtype and on its device, that the engine holds whole in HF's layout (embeddings, norms, o_proj / down_proj,
routers and MoE experts at TP = 1 without FSDP sharding) and that needs no LoRA merge — a LoRA run's frozen bf16
base, or bf16 masters — is handed to the engine as it is: no copy, no engine memory. Safe because the engine only
reads it and sleeps before the optimizer next writes it (hybrid scheme only; a resident engine keeps copies).
An expert tensor with LoRA adapters (peft's ParamWrapper) is borrowed too where its base can be: the engine is told
once (`set_expert_adapters`) to add the update unmerged, and each reshard sends, after the borrowed base, its whole
per-expert factors A [E, r, in] and B [E, out, r] in the engine's dtype (E·r·(in + out): small). Where borrowing
does not apply (TP > 1, FSDP sharding, another dtype, offload, scheme A) it is merged as above.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hybridrl.training.lora import ExpertMerge, engine_parameters

SliceSpec = tuple[int, int, int] | tuple[int, int, int, int] | None  # (dim, start, length[, blocks]); None = whole


@dataclass
class ReshardStats:
    seconds: float = 0.0
    bytes_received: int = 0  # bytes this rank received from other ranks
    bytes_borrowed: int = 0  # bytes the engine uses in place (the actor's own tensors)
    tensors: int = 0
    strategy: str = ""

    def metrics(self) -> dict[str, float]:
        gb = self.bytes_received / 1e9
        return {
            "timing_s/reshard": self.seconds,
            "reshard/bytes_received_gb": gb,
            "reshard/bandwidth_gb_s": gb / self.seconds if self.seconds > 0 else 0.0,
            "reshard/tensors": float(self.tensors),
            "reshard/borrowed_gb": self.bytes_borrowed / 1e9,
        }


def _row_range(n_rows: int, group_size: int, index: int) -> tuple[int, int]:
    per = math.ceil(n_rows / group_size) if n_rows else 0
    start = min(n_rows, index * per)
    return start, min(n_rows, start + per)


def _fsdp_group(param: DTensor):
    """The process group FSDP shards this parameter over (the last mesh dim, 'fsdp' in 1-D and HSDP)."""
    mesh = param.device_mesh
    return mesh.get_group(mesh.ndim - 1), mesh.size(mesh.ndim - 1)


def _box(shape: torch.Size, spec: SliceSpec) -> tuple[int, int, int, int]:
    """The spec as (dim, start, length, blocks)."""
    if spec is None:
        return 0, 0, shape[0], 1
    dim, start, length, *rest = spec
    blocks = rest[0] if rest else 1
    if dim == 0 and blocks != 1:
        raise ValueError(f"weight_shard_spec {spec}: a slice in blocks must be on a dim other than 0 (FSDP's)")
    return dim, start, length, blocks


def _piece(local: torch.Tensor, rows: tuple[int, int], box: tuple[int, int, int, int]) -> torch.Tensor:
    """The part of this rank's rows that falls inside `box`, as a flat contiguous tensor."""
    dim, start, length, blocks = box
    r0, r1 = rows
    if dim == 0:
        lo, hi = max(r0, start), min(r1, start + length)
        if hi <= lo:
            return local.new_empty(0)
        return local[lo - r0 : hi - r0].reshape(-1)
    return local.unflatten(dim, (blocks, -1)).narrow(dim + 1, start, length).reshape(-1)


def _piece_numel(shape: torch.Size, rows: tuple[int, int], box: tuple[int, int, int, int]) -> int:
    dim, start, length, blocks = box
    r0, r1 = rows
    inner = math.prod(shape[1:]) if len(shape) > 1 else 1
    if dim == 0:
        return max(0, min(r1, start + length) - max(r0, start)) * inner
    return (r1 - r0) * inner // shape[dim] * length * blocks


class FSDPToTPResharder:
    """Streams (hf_name, tensor) pairs for one engine from an FSDP2-wrapped HF model.

    `specs_by_rank[name][g]` is the slice FSDP-group member g needs; it is exchanged once (all_gather_object) and cached,
    since the TP layout does not change between steps.
    """

    def __init__(self, module: torch.nn.Module, engine, dtype: torch.dtype, device: torch.device, strategy: str = "slice",
                 borrow: bool = False):
        if strategy not in ("slice", "gather"):
            raise ValueError(f"reshard strategy must be 'slice' or 'gather', got {strategy!r}")
        if device.type == "cuda" and device.index is None:  # compared with tensors' devices, which carry an index
            device = torch.device("cuda", torch.cuda.current_device())
        self.module, self.engine, self.dtype, self.device = module, engine, dtype, device
        self.strategy, self.borrow = strategy, borrow
        self._specs: dict[str, list[SliceSpec]] | None = None
        self._borrowed: frozenset[str] | None = None
        self._unmerged: dict[str, tuple[str, str]] = {}   # borrowed expert tensor -> its factors' engine names
        self.last = ReshardStats(strategy=strategy)

    # -------------------------------------------------------------------- borrowing
    def _whole_here(self, p: torch.Tensor) -> torch.Tensor | None:
        """This rank's tensor of `p` when it is the whole parameter in the engine's dtype and device, else None."""
        local = p.to_local() if isinstance(p, DTensor) else p
        whole = local.shape == p.shape and local.dtype == self.dtype and local.device == self.device
        return local.detach() if whole and local.is_contiguous() else None

    def borrowed_names(self) -> frozenset[str]:
        """HF names of the tensors the engine uses in place (empty unless `borrow`); fixed for the run, since
        layouts, dtypes and devices do not change between steps. On the first call, adapted expert tensors among
        them are set up in the engine to add their LoRA update unmerged (`set_expert_adapters`)."""
        if self._borrowed is None:
            names, adapters = set(), {}
            unmerged = self.borrow and hasattr(self.engine, "set_expert_adapters")
            for name, p, merge in engine_parameters(self.module):
                if not (self.borrow and (merge is None or (unmerged and isinstance(merge, ExpertMerge)))
                        and self._whole_here(p) is not None and self.engine.weight_borrowable(name, tuple(p.shape))):
                    continue
                names.add(name)
                if merge is not None:
                    adapters[name] = (merge.rank, merge.scaling)
            self._unmerged = self.engine.set_expert_adapters(adapters) if adapters else {}
            self._borrowed = frozenset(names)
        return self._borrowed

    def unmerged_experts(self) -> frozenset[str]:
        """HF names of the adapted expert tensors the engine borrows and adds the LoRA update to unmerged."""
        self.borrowed_names()
        return frozenset(self._unmerged)

    def borrowed_params(self) -> int:
        """Parameters the engine uses in place (what the plan predicts as `rollout.borrowed_params`)."""
        names = self.borrowed_names()
        return sum(p.numel() for name, p, _ in engine_parameters(self.module) if name in names)

    # -------------------------------------------------------------------- specs
    def _exchange_specs(self) -> dict[str, list[SliceSpec]]:
        mine: dict[str, SliceSpec] = {}
        group, size = None, 1
        for name, p, _ in engine_parameters(self.module):
            mine[name] = self.engine.weight_shard_spec(name, tuple(p.shape))
            if isinstance(p, DTensor) and group is None:
                group, size = _fsdp_group(p)
        if size == 1:
            return {n: [s] for n, s in mine.items()}
        gathered: list[dict] = [None] * size  # type: ignore[list-item]
        dist.all_gather_object(gathered, mine, group=group)
        return {n: [g[n] for g in gathered] for n in mine}

    def _use_slice(self, p: torch.Tensor) -> bool:
        if self.strategy != "slice" or not isinstance(p, DTensor):
            return False
        group, size = _fsdp_group(p)
        return size > 1 and dist.get_backend(group) in ("nccl", "gloo")

    # -------------------------------------------------------------------- streaming
    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self._specs is None:
            self._specs = self._exchange_specs()
        stats = ReshardStats(strategy=self.strategy)
        self.last = stats
        borrowed = self.borrowed_names()
        for name, p, merge in engine_parameters(self.module):
            if name in borrowed:
                tensor = self._whole_here(p)
                stats.bytes_borrowed += tensor.numel() * tensor.element_size()
                stats.tensors += 1
                yield name, tensor
                if name in self._unmerged:   # the LoRA factors beside the borrowed base: B_e·A_e unmerged
                    lhs, rhs = merge.factors()
                    for factor_name, factor in zip(self._unmerged[name], (rhs, lhs)):
                        stats.tensors += 1
                        yield factor_name, factor.to(self.device, self.dtype).contiguous()
                continue
            if isinstance(p, DTensor):
                local = p.to_local().detach()
                # LoRA: merge this rank's rows in the master dtype, before the cast and the exchange
                local = (local if merge is None else merge(local)).to(self.device, self.dtype, non_blocking=True)
                if self._use_slice(p):
                    tensor, received = self._slice_exchange(p, local, self._specs[name])
                elif local.shape == p.shape:  # this rank's shard is the whole tensor (a group of one): no gather
                    tensor, received = local, 0
                else:
                    tensor = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape,
                                                stride=p.stride()).full_tensor()
                    received = tensor.numel() - local.numel()
            else:
                tensor, received = (p.detach() if merge is None else merge(p.detach())).to(self.device, self.dtype), 0
            stats.bytes_received += received * tensor.element_size()
            stats.tensors += 1
            yield name, tensor
            del tensor

    def _slice_exchange(self, p: DTensor, local: torch.Tensor, specs: list[SliceSpec]) -> tuple[torch.Tensor, int]:
        group, size = _fsdp_group(p)
        me = dist.get_rank(group)
        shape = p.shape
        rows = [_row_range(shape[0], size, g) for g in range(size)]
        boxes = [_box(shape, s) for s in specs]
        send = [_piece(local, rows[me], boxes[g]) for g in range(size)]
        in_splits = [t.numel() for t in send]
        out_splits = [_piece_numel(shape, rows[g], boxes[me]) for g in range(size)]
        out = local.new_empty(sum(out_splits))
        dist.all_to_all_single(out, torch.cat(send) if send else local.new_empty(0), out_splits, in_splits, group=group)
        dim, start, length, blocks = boxes[me]
        out_shape = list(shape)
        out_shape[dim] = length * blocks
        if dim == 0:
            tensor = out.view(out_shape)
        else:
            # pieces arrive per source rank as [rows_g, ..., length, ...]: concatenate along dim 0
            parts, offset = [], 0
            for g in range(size):
                piece_shape = list(out_shape)
                piece_shape[0] = rows[g][1] - rows[g][0]
                numel = out_splits[g]
                parts.append(out[offset : offset + numel].view(piece_shape))
                offset += numel
            tensor = torch.cat(parts, dim=0)
        return tensor, sum(out_splits) - out_splits[me]

    def reshard(self) -> ReshardStats:
        """Load the current actor weights into the engine; returns the stats of this reshard."""
        sync = self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        self.engine.load_weights(self.iter_weights())
        if sync:
            torch.cuda.synchronize(self.device)
        self.last.seconds = time.perf_counter() - t0
        return self.last
