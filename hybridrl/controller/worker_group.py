"""RayWorkerGroup: one Ray actor per bundle of a resource pool, driven from the single controller.

``wg = RayWorkerGroup(pool, RayClassWithInitArgs(MyWorker, cfg), worker_timeout_s=...)`` creates the
actors in rank order and binds every ``@register``-ed method of ``MyWorker`` as ``wg.method(...)``
(dispatch and collect as in ``dispatch.py``). ``wg.method.remote(...)`` (or ``blocking=False`` in the
decorator) returns a ``WorkerGroupFuture``.

Choices:
- Rank env is handed to each actor's constructor (a thin subclass sets os.environ before the user's
  ``__init__``) instead of a per-actor Ray runtime_env, so actors reuse Ray's pooled worker processes.
  MASTER_ADDR is rank 0's node; the port is bound by rank 0 itself inside ``init_distributed`` and handed to
  the other ranks through Ray's key-value store (rendezvous.py), so no port is chosen before it is bound and
  none can be taken in between. A user ``__init__`` that already calls ``init_distributed`` works the same.
- Futures keep one ObjectRef per rank. When the next call splits the data the same way (same number of
  DP chunks, no padding), the chunks go as ObjectRefs straight to the next workers (Ray moves them
  worker to worker); otherwise the future is resolved on the driver and split again.
- Waiting is one loop over ``ray.wait`` with a deadline (``trainer.worker_timeout_s``): the first worker
  error is raised at once as ``WorkerError`` (method, rank, remote traceback), a killed actor as
  ``WorkerDiedError`` naming the rank, and a call still running at the deadline as ``TimeoutError``
  naming the ranks that did not answer. A hung call cannot be interrupted inside a worker, so after a
  timeout the group should be shut down (``wg.shutdown()`` kills the actors).
- Padding rows are counted per method in ``wg.padded_rows``: the workers compute on them (an update
  trains on the repeated rows) before the collect drops their outputs, so the trainer can report it.
- Results of non-collecting ranks in mesh dispatch are still fetched (to surface their errors); keep
  them small (e.g. return None) where they are large.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridrl.controller.dispatch import (
    ChunkLayout,
    Dispatch,
    MeshDispatch,
    collect_dataproto,
    get_dispatch_spec,
    split_dataproto,
)
from hybridrl.controller.rendezvous import RDZV_KEY_ENV, forget_rendezvous
from hybridrl.controller.resource_pool import RayResourcePool
from hybridrl.controller.worker import Worker
from hybridrl.protocol import DataProto

__all__ = ["RayClassWithInitArgs", "RayWorkerGroup", "WorkerGroupFuture", "WorkerError", "WorkerDiedError"]


class WorkerError(RuntimeError):
    """A worker raised (or died) inside ``method``; ``rank`` says which one, ``worker_traceback`` how."""

    def __init__(self, group: str, method: str, rank: int, worker_traceback: str, what: str = "raised"):
        self.group, self.method, self.rank, self.worker_traceback = group, method, rank, worker_traceback
        super().__init__(f"worker rank {rank} of group {group!r} {what} in {method!r}; worker traceback:\n"
                         f"{worker_traceback}")


class WorkerDiedError(WorkerError):
    """The actor process of ``rank`` is gone (killed, crashed, or its ``__init__`` failed)."""


class RayClassWithInitArgs:
    """A Worker subclass and the arguments of its constructor; ``with_options`` adds Ray actor options."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any):
        modified = getattr(getattr(cls, "__ray_metadata__", None), "modified_class", None)
        cls = modified.__bases__[0] if modified is not None and len(modified.__bases__) == 1 else cls
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise ValueError(f"RayClassWithInitArgs: cls must be a subclass of hybridrl.controller.Worker "
                             f"(the plain class, not ray.remote(cls)), got {cls!r}")
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.ray_options: dict[str, Any] = {}

    def with_options(self, **ray_options: Any) -> RayClassWithInitArgs:
        self.ray_options.update(ray_options)
        return self


def _actor_class(cls: type) -> type:
    """Subclass of ``cls`` whose constructor first installs the rank env, then runs ``cls.__init__``."""

    def __init__(self, hybridrl_env: dict[str, str], *args, **kwargs):
        os.environ.update(hybridrl_env)
        Worker._read_env(self)
        cls.__init__(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__qualname__": cls.__qualname__})


class WorkerGroupFuture:
    """Result of a non-blocking call: one ObjectRef per rank plus how to collect them. ``get()`` resolves.

    Pass it as an argument of the next group call to chain without a round-trip through the driver."""

    def __init__(self, group: RayWorkerGroup, method: str, refs: list, collect: Callable[[list], Any],
                 chunk_ranks: list[int] | None = None, padded: bool = False, single_rank: int | None = None):
        self.group, self.method, self.refs, self._collect = group, method, refs, collect
        self.chunk_ranks = chunk_ranks  # rank holding DP chunk d, in dp order (DP / mesh calls)
        self.padded = padded
        self.single_rank = single_rank  # RANK_ZERO: the value is refs[single_rank]
        self._done = False
        self._value: Any = None

    @property
    def chunk_refs(self) -> list | None:
        return None if self.chunk_ranks is None else [self.refs[r] for r in self.chunk_ranks]

    def get(self, timeout_s: float | None = None) -> Any:
        if not self._done:
            outputs = self.group._wait(self.refs, self.method, timeout_s)
            self._value, self._done = self._collect(outputs), True
        return self._value

    def __repr__(self) -> str:
        return f"WorkerGroupFuture({self.group.name_prefix}.{self.method}, ranks={len(self.refs)}, done={self._done})"


class _BoundMethod:
    def __init__(self, group: RayWorkerGroup, name: str, mode, blocking: bool):
        self.group, self.name, self.mode, self.blocking = group, name, mode, blocking

    def __call__(self, *args, **kwargs):
        future = self.group._submit(self.name, self.mode, args, kwargs)
        return future if not self.blocking else future.get()

    def remote(self, *args, **kwargs) -> WorkerGroupFuture:
        return self.group._submit(self.name, self.mode, args, kwargs)


def _remote_traceback(error: Exception) -> str:
    """Ray's text of a remote failure (process, pid, the worker's traceback), without terminal colours."""
    return _ANSI.sub("", str(error))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PRIMITIVES = (int, float, str, bool, bytes, type(None))


class RayWorkerGroup:
    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: RayClassWithInitArgs,
                 name_prefix: str | None = None, worker_timeout_s: float = 1800.0):
        if not isinstance(worker_timeout_s, int | float) or worker_timeout_s <= 0:
            raise ValueError(f"RayWorkerGroup: worker_timeout_s (trainer.worker_timeout_s) must be a number "
                             f"> 0, got {worker_timeout_s!r}")
        cls = ray_cls_with_init.cls
        self.name_prefix = name_prefix or f"{cls.__name__}_{uuid.uuid4().hex[:6]}"
        self.worker_timeout_s = float(worker_timeout_s)
        self.resource_pool = resource_pool
        self._mesh_cache: dict[str, tuple[list[int], int, list[int]]] = {}
        self._alive = True
        self.padded_rows: dict[str, int] = {}  # method -> rows added by DP padding so far (computed, then dropped)
        placements = resource_pool.placements()
        self.world_size = len(placements)
        self.master_addr = self._node_address(*placements[0][:2])
        self.rendezvous_key = f"hybridrl_rdzv_{self.name_prefix}_{uuid.uuid4().hex}"
        actor_cls = ray.remote(_actor_class(cls))
        local_world = resource_pool.process_on_nodes
        self.workers = []
        for rank, (pg, bundle, node) in enumerate(placements):
            env = {"RANK": str(rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(bundle),
                   "HYBRIDRL_LOCAL_RANK": str(bundle), "LOCAL_WORLD_SIZE": str(local_world[node]),
                   "NODE_RANK": str(node), "HYBRIDRL_USE_GPU": str(int(resource_pool.use_gpu)),
                   "MASTER_ADDR": self.master_addr, RDZV_KEY_ENV: self.rendezvous_key}
            options = {**resource_pool.actor_resources(), "name": f"{self.name_prefix}_rank{rank}",
                       "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, bundle),
                       **ray_cls_with_init.ray_options}
            self.workers.append(actor_cls.options(**options).remote(env, *ray_cls_with_init.args,
                                                                     **ray_cls_with_init.kwargs))
        self._bind_methods(cls)
        # the first answer also says that every constructor finished; `placement` records where each rank runs
        self.placement = self._wait([w.placement_info.remote() for w in self.workers], "__init__", None)

    @staticmethod
    def _node_address(pg, bundle: int) -> str:
        """The IP of the node holding `bundle` of `pg` (rank 0's: MASTER_ADDR)."""
        node_id = ray.util.placement_group_table(pg)["bundles_to_node_id"][bundle]
        return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)

    def _bind_methods(self, cls: type) -> None:
        for name in dir(cls):
            spec = get_dispatch_spec(getattr(cls, name, None))
            if spec is None:
                continue
            if hasattr(self, name):
                raise ValueError(f"{cls.__name__}.{name}: this name is reserved by RayWorkerGroup; rename the method")
            setattr(self, name, _BoundMethod(self, name, spec.mode, spec.blocking))

    # ---------------------------------------------------------------- public helpers
    def execute_all(self, method_name: str, *args, **kwargs) -> list:
        """Call any worker method on all ranks with the same arguments (blocking), results in rank order."""
        return self._submit(method_name, Dispatch.ONE_TO_ALL, args, kwargs).get()

    def shutdown(self) -> None:
        """Kill the actors (the resource pool stays; ``pool.release()`` frees its placement groups)."""
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # already dead: nothing left to kill
                pass
        forget_rendezvous(self.rendezvous_key)
        self._alive = False

    # ---------------------------------------------------------------- dispatch
    def _submit(self, method: str, mode, args: tuple, kwargs: dict) -> WorkerGroupFuture:
        if not self._alive:
            raise RuntimeError(f"worker group {self.name_prefix!r} was shut down; cannot call {method!r}")
        W = self.world_size
        if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
            a = [self._shared(v) for v in args]
            kw = {k: self._shared(v) for k, v in kwargs.items()}
            refs = self._call(method, [(a, kw)] * W)
            if mode is Dispatch.RANK_ZERO:
                return WorkerGroupFuture(self, method, refs, lambda outs: outs[0], single_rank=0)
            return WorkerGroupFuture(self, method, refs, list)
        if mode is Dispatch.ALL_TO_ALL:
            per_arg = [self._per_rank(method, f"argument {i}", v) for i, v in enumerate(args)]
            per_kw = {k: self._per_rank(method, f"argument {k!r}", v) for k, v in kwargs.items()}
            calls = [([p[r] for p in per_arg], {k: p[r] for k, p in per_kw.items()}) for r in range(W)]
            return WorkerGroupFuture(self, method, self._call(method, calls), list)
        if mode is Dispatch.DP_COMPUTE_PROTO:
            return self._submit_dp(method, args, kwargs, list(range(W)), W, list(range(W)))
        if isinstance(mode, MeshDispatch):
            return self._submit_dp(method, args, kwargs, *self._mesh_info(mode.mesh_name))
        raise ValueError(f"{method}: unknown dispatch mode {mode!r}")

    def _call(self, method: str, calls: list[tuple[list, dict]]) -> list:
        return [getattr(w, method).remote(*a, **kw) for w, (a, kw) in zip(self.workers, calls, strict=True)]

    def _shared(self, value: Any) -> Any:
        """An argument every rank receives: put once in the object store (forwarded if a RANK_ZERO future)."""
        if isinstance(value, WorkerGroupFuture):
            if value.single_rank is not None:
                return value.refs[value.single_rank]
            value = value.get()
        return value if isinstance(value, _PRIMITIVES) else ray.put(value)

    def _per_rank(self, method: str, what: str, value: Any) -> list:
        if isinstance(value, WorkerGroupFuture):
            if len(value.refs) == self.world_size and value.single_rank is None:
                return list(value.refs)
            value = value.get()
        if not isinstance(value, list | tuple) or len(value) != self.world_size:
            got = f"{type(value).__name__} of length {len(value)}" if isinstance(value, list | tuple) else type(value).__name__
            raise ValueError(f"{method} (ALL_TO_ALL): {what} must be a list of world_size={self.world_size} "
                             f"items, one per rank; got {got}")
        return list(value)

    def _submit_dp(self, method: str, args: tuple, kwargs: dict, dp_of_rank: list[int], dp_size: int,
                   collectors: list[int]) -> WorkerGroupFuture:
        items = dict(enumerate(args)) | dict(kwargs)
        forward = {k: v for k, v in items.items() if isinstance(v, WorkerGroupFuture) and v.chunk_ranks is not None
                   and len(v.chunk_ranks) == dp_size and not v.padded}
        resolved = {k: (v.get() if isinstance(v, WorkerGroupFuture) and k not in forward else v) for k, v in items.items()}
        protos = {k: v for k, v in resolved.items() if isinstance(v, DataProto)}
        if protos and forward:  # mixed with driver-side data: chunk boundaries must come from one split
            protos |= {k: forward.pop(k).get() for k in list(forward)}
        if not protos and not forward:
            raise ValueError(f"{method}: a DP-dispatched method needs at least one DataProto argument, got "
                             f"{[type(v).__name__ for v in items.values()]}")
        layout: ChunkLayout | None = None
        chunks: dict[Any, list] = {}
        if protos:
            sizes = {k: len(v) for k, v in protos.items()}
            if len(set(sizes.values())) > 1:
                raise ValueError(f"{method}: DataProto arguments have different batch sizes {sizes}; "
                                 "they are split together and must match")
            for k, v in protos.items():
                parts, layout = split_dataproto(v, dp_size, method)
                chunks[k] = [ray.put(p) for p in parts]
            pad = dp_size * layout.rows - sum(layout.real)
            self.padded_rows[method] = self.padded_rows.get(method, 0) + pad
        for k, fut in forward.items():
            chunks[k] = fut.chunk_refs
        shared = {k: self._shared(v) for k, v in resolved.items() if k not in chunks}
        calls = []
        for r in range(self.world_size):
            per = {k: chunks[k][dp_of_rank[r]] for k in chunks} | shared
            calls.append(([per[i] for i in range(len(args))], {k: per[k] for k in kwargs}))
        refs = self._call(method, calls)

        def collect(outputs: list) -> Any:
            return collect_dataproto([outputs[r] for r in collectors], layout, method)

        return WorkerGroupFuture(self, method, refs, collect, chunk_ranks=list(collectors),
                                 padded=layout is not None and layout.padded)

    def _mesh_info(self, mesh_name: str) -> tuple[list[int], int, list[int]]:
        if mesh_name in self._mesh_cache:
            return self._mesh_cache[mesh_name]
        what = f"get_dispatch_info({mesh_name!r})"
        infos = self._wait([w.get_dispatch_info.remote(mesh_name) for w in self.workers], what, None)
        unset = [r for r, i in enumerate(infos) if i is None]
        if unset:
            raise ValueError(f"mesh dispatch {mesh_name!r}: ranks {unset} have not called "
                             f"self.set_dispatch_info({mesh_name!r}, dp_rank, dp_size, is_collect)")
        dp_sizes = sorted({i[1] for i in infos})
        if len(dp_sizes) != 1:
            raise ValueError(f"mesh dispatch {mesh_name!r}: ranks disagree on dp_size {dp_sizes}")
        dp_size = dp_sizes[0]
        collectors = []
        for d in range(dp_size):
            members = [r for r, i in enumerate(infos) if i[0] == d]
            coll = [r for r in members if infos[r][2]]
            if not members or len(coll) != 1:
                raise ValueError(f"mesh dispatch {mesh_name!r}: dp_rank {d} has ranks {members} of which "
                                 f"{coll} collect; each dp_rank needs ranks and exactly one is_collect=True")
            collectors.append(coll[0])
        self._mesh_cache[mesh_name] = ([i[0] for i in infos], dp_size, collectors)
        return self._mesh_cache[mesh_name]

    # ---------------------------------------------------------------- waiting
    def _wait(self, refs: list, method: str, timeout_s: float | None) -> list:
        timeout_s = self.worker_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        pending = {ref: rank for rank, ref in enumerate(refs)}
        outputs: list[Any] = [None] * len(refs)
        while pending:
            remaining = deadline - time.monotonic()
            ready = ray.wait(list(pending), num_returns=1, timeout=max(remaining, 0))[0] if remaining > 0 else []
            if not ready:
                raise TimeoutError(f"{self.name_prefix}.{method}: ranks {sorted(pending.values())} of "
                                   f"{len(refs)} did not answer within {timeout_s}s (trainer.worker_timeout_s); "
                                   "a collective may be waiting for a failed peer. The group cannot recover "
                                   "from this: call wg.shutdown()")
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    outputs[rank] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    raise WorkerDiedError(self.name_prefix, method, rank, _remote_traceback(e), "died (actor process gone)") from e
                except ray.exceptions.RayTaskError as e:
                    raise WorkerError(self.name_prefix, method, rank, _remote_traceback(e)) from e
        return outputs
