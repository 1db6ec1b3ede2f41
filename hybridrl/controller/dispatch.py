"""Dispatch modes: how a call on a worker group is split over its workers and how results come back.

A worker method marked ``@register(dispatch_mode=..., blocking=...)`` is bound on the group as
``wg.method(...)``. The modes (verl's names):

  ONE_TO_ALL        every worker gets the same arguments; returns the list of results (rank order)
  ALL_TO_ALL        every argument is a list of world_size items, item r goes to rank r; returns the list
  DP_COMPUTE_PROTO  every DataProto argument is split into world_size chunks (padded to a divisor first);
                    other arguments are sent to all; the DataProto results are concatenated and unpadded
  RANK_ZERO         runs on all workers with the same arguments (so collectives inside still meet) and
                    returns rank 0's result
  make_mesh_dispatch(name)
                    DP over a mesh the workers declare with ``Worker.set_dispatch_info``: chunk d goes to
                    every rank whose dp_rank is d; results come only from the ranks marked is_collect,
                    in dp order (e.g. the rollout mesh: dp = world/tp, only infer_tp rank 0 collects)

Choices:
- Padding repeats rows from the start (``pad_dataproto_to_divisor``), so pad rows sit at the end of the
  last chunks. Unpadding is done per chunk: a chunk with ``real`` rows out of ``rows`` whose output has
  ``k * rows`` rows (k = 1 for log-probs, k = n for a rollout producing n samples a prompt, adjacent)
  keeps its first ``k * real`` rows. An output whose length is not a multiple of its input chunk cannot
  be unpadded and raises instead of returning padded rows.
- Non-DataProto arguments of DP modes are broadcast rather than rejected (a temperature, a flag).
- This module imports no Ray, so a worker module can use ``register``/``Dispatch`` where Ray is absent.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridrl.protocol import DataProto, pad_dataproto_to_divisor

__all__ = ["Dispatch", "MeshDispatch", "make_mesh_dispatch", "register", "get_dispatch_spec",
           "DispatchSpec", "split_dataproto", "collect_dataproto"]

DISPATCH_ATTR = "_hybridrl_dispatch"


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MeshDispatch:
    """DP dispatch over the mesh named ``mesh_name`` (see ``Worker.set_dispatch_info``)."""

    mesh_name: str


def make_mesh_dispatch(mesh_name: str) -> MeshDispatch:
    if not isinstance(mesh_name, str) or not mesh_name:
        raise ValueError(f"make_mesh_dispatch: mesh_name must be a non-empty string, got {mesh_name!r}")
    return MeshDispatch(mesh_name)


@dataclass(frozen=True)
class DispatchSpec:
    mode: Dispatch | MeshDispatch
    blocking: bool


def register(dispatch_mode: Dispatch | MeshDispatch = Dispatch.ALL_TO_ALL, blocking: bool = True) -> Callable:
    """Mark a worker method for binding on the group. The method itself is unchanged on the worker."""
    if not isinstance(dispatch_mode, Dispatch | MeshDispatch):
        raise ValueError(f"register: dispatch_mode must be a Dispatch member or make_mesh_dispatch(...), "
                         f"got {dispatch_mode!r}")

    def decorate(fn):
        setattr(fn, DISPATCH_ATTR, DispatchSpec(dispatch_mode, bool(blocking)))
        return fn

    return decorate


def get_dispatch_spec(fn: Any) -> DispatchSpec | None:
    return getattr(fn, DISPATCH_ATTR, None)


@dataclass(frozen=True)
class ChunkLayout:
    """How a DataProto was cut: ``rows`` rows per chunk, of which ``real[d]`` are real (the rest padding)."""

    rows: int
    real: tuple[int, ...]

    @property
    def padded(self) -> bool:
        return any(r != self.rows for r in self.real)


def split_dataproto(data: DataProto, chunks: int, method: str) -> tuple[list[DataProto], ChunkLayout]:
    """Pad ``data`` to a multiple of ``chunks`` and cut it; the layout tells ``collect_dataproto`` what to drop."""
    n = len(data)
    if n == 0:
        raise ValueError(f"{method}: cannot split an empty DataProto over {chunks} workers")
    padded, pad = pad_dataproto_to_divisor(data, chunks)
    rows = len(padded) // chunks
    real = tuple(max(0, min(rows, n - d * rows)) for d in range(chunks))
    assert sum(real) == n and pad == chunks * rows - n, (real, pad, n)
    return padded.chunk(chunks), ChunkLayout(rows, real)


def collect_dataproto(outputs: list[Any], layout: ChunkLayout | None, method: str) -> Any:
    """Concatenate per-chunk DataProto outputs, dropping the rows produced from padding.

    Non-DataProto outputs come back as the list (rank/dp order); with padding that would silently mix in
    results of padded rows, so it raises."""
    if not all(isinstance(o, DataProto) for o in outputs):
        if layout is not None and layout.padded:
            kinds = sorted({type(o).__name__ for o in outputs})
            raise ValueError(f"{method}: the batch was padded ({sum(layout.rows - r for r in layout.real)} rows) "
                             f"but the workers returned {kinds}, not DataProto, so the padded rows cannot be "
                             "removed; return a DataProto or send a batch divisible by the DP size")
        return outputs
    if layout is None or not layout.padded:
        return DataProto.concat(outputs)
    kept = []
    for d, (out, real) in enumerate(zip(outputs, layout.real, strict=True)):
        if len(out) % layout.rows:
            raise ValueError(f"{method}: chunk {d} had {layout.rows} input rows ({layout.rows - real} padding) "
                             f"but returned {len(out)} rows, not a multiple, so padding cannot be removed")
        keep = real * (len(out) // layout.rows)
        kept.append(out.slice(0, keep))
    return DataProto.concat(kept)
