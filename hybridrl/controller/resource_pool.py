"""Ray resources: connecting to Ray (``init_ray``) and reserving bundles (``RayResourcePool``).

A pool holds one placement group per node (STRICT_PACK), one bundle per GPU, or one CPU bundle per
process when ``use_gpu=False`` so that everything also runs on CPU-only machines. A worker group places
one actor per bundle, in rank order (node 0's bundles first). ``max_colocate_count`` actors may share a
bundle: each takes 1/max_colocate_count of it, which lets a second role share the GPUs of the first
(the usual colocation is one worker class composing several roles in one process, as verl's
ActorRolloutRefWorker does; a role can also get its own pool).

Choices: placement groups are created lazily and waited on with a timeout, so a pool asking for more
than the cluster has fails with the numbers in the message instead of waiting forever. Each placement group
after the first excludes the machines the earlier ones took (a node-id label selector), so the pool's
"nodes" are distinct machines even when one machine could hold two of them (a CPU pool, or
``n_gpus_per_node`` below a machine's GPU count); without that, Ray's packing could put "node" 0 and 1 on one
machine and rank 0's machine would host ranks the config meant for another.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

__all__ = ["RayResourcePool", "init_ray"]


def init_ray(address: str | None = None, num_cpus: int | None = None, **ray_init_kwargs: Any) -> dict:
    """Connect to Ray: ``address`` (or RAY_ADDRESS) joins an existing cluster; otherwise a local Ray starts.

    Does nothing when Ray is already initialised. Returns the cluster's total resources."""
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is not None and num_cpus is not None:
            raise ValueError(f"init_ray: num_cpus={num_cpus} only applies to a local Ray, not when joining "
                             f"the cluster at {address!r}; drop one of them")
        kwargs = {"include_dashboard": False, **ray_init_kwargs}
        with _keep_signal_handlers():
            if address:
                ray.init(address=address, **kwargs)
            else:
                _quiet_default_token_auth_notice()
                ray.init(num_cpus=num_cpus, **kwargs)
    return dict(ray.cluster_resources())


@contextlib.contextmanager
def _keep_signal_handlers():
    """ray.init replaces the driver's SIGTERM handler (with a sys.exit); the driver's own handlers (the clean stop
    of main_ppo.run_until_stopped) are put back. Only the main thread may set handlers."""
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:   # None: a handler set outside Python, which cannot be put back
                signal.signal(signum, handler)


class _DropRecord(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _quiet_default_token_auth_notice() -> None:
    """Ray turns token authentication on for a new local cluster and, while RAY_AUTH_MODE is unset, warns that it
    did: a notice that asks nothing of the user (the protection stays: no other process on the machine can submit
    code to the cluster). Only that record is dropped. Setting RAY_AUTH_MODE=token here would not do: Ray reads the
    mode once, when it is imported, so a value set later reaches the cluster's processes but not this one, and
    they refuse each other; a user's own RAY_AUTH_MODE, set before Ray starts, is what Ray already honours."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    ray_logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropRecord) for f in ray_logger.filters):
        ray_logger.addFilter(_DropRecord("Token authentication is enabled for this Ray cluster"))


class RayResourcePool:
    def __init__(self, process_on_nodes: list[int], use_gpu: bool = True, max_colocate_count: int = 1,
                 cpus_per_bundle: float = 1.0, name_prefix: str = "hybridrl_pool",
                 placement_timeout_s: float = 120.0):
        if not process_on_nodes or any(not isinstance(n, int) or n <= 0 for n in process_on_nodes):
            raise ValueError(f"RayResourcePool: process_on_nodes must be a non-empty list of positive ints "
                             f"(trainer.n_gpus_per_node repeated trainer.nnodes times), got {process_on_nodes!r}")
        if not isinstance(max_colocate_count, int) or max_colocate_count < 1:
            raise ValueError(f"RayResourcePool: max_colocate_count must be an int >= 1, got {max_colocate_count!r}")
        if cpus_per_bundle <= 0:
            raise ValueError(f"RayResourcePool: cpus_per_bundle must be > 0, got {cpus_per_bundle}")
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = bool(use_gpu)
        self.max_colocate_count = max_colocate_count
        self.cpus_per_bundle = float(cpus_per_bundle)
        self.name_prefix = name_prefix
        self.placement_timeout_s = placement_timeout_s
        self._pgs: list | None = None
        self.node_ids: list[str] = []  # Ray node id of each placement group, in node order

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus_per_bundle}
        if self.use_gpu:
            b["GPU"] = 1.0
        return b

    def actor_resources(self) -> dict[str, float]:
        """Ray options for one actor: its share of a bundle."""
        opts = {"num_cpus": self.cpus_per_bundle / self.max_colocate_count}
        if self.use_gpu:
            opts["num_gpus"] = 1.0 / self.max_colocate_count
        return opts

    def get_placement_groups(self) -> list:
        if self._pgs is not None:
            return self._pgs
        import ray
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

        deadline = time.monotonic() + self.placement_timeout_s
        pgs, nodes = [], []
        for i, n in enumerate(self.process_on_nodes):
            other_machine = [{"ray.io/node-id": f"!in({','.join(nodes)})"}] * n if nodes else None
            pgs.append(placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name_prefix}_node{i}",
                                       bundle_label_selector=other_machine))
            try:
                ray.get(pgs[-1].ready(), timeout=max(deadline - time.monotonic(), 0.01))
            except ray.exceptions.GetTimeoutError:
                for pg in pgs:
                    remove_placement_group(pg)
                raise ValueError(self._unplaced(i)) from None
            nodes.append(placement_group_table(pgs[-1])["bundles_to_node_id"][0])
        self._pgs, self.node_ids = pgs, nodes
        return pgs

    def _unplaced(self, node: int) -> str:
        import ray

        n = self.process_on_nodes[node]
        where = (f"node {node} found no machine, other than those of nodes 0-{node - 1}, with {n} bundles free"
                 if node else f"node 0 found no machine with {n} bundles free")
        return (f"RayResourcePool {self.name_prefix!r}: could not reserve {self.process_on_nodes} bundles of "
                f"{self.bundle()} (one placement group per node, each on its own machine) within "
                f"{self.placement_timeout_s}s: {where}; the cluster has {sum(n['Alive'] for n in ray.nodes())} machines, "
                f"{ray.available_resources()} free of {ray.cluster_resources()}. "
                "Check trainer.nnodes / trainer.n_gpus_per_node")

    def placements(self) -> list[tuple[Any, int, int]]:
        """(placement group, bundle index, node rank) for each rank, in rank order."""
        pgs = self.get_placement_groups()
        return [(pg, b, node) for node, (pg, n) in enumerate(zip(pgs, self.process_on_nodes)) for b in range(n)]

    def release(self) -> None:
        """Remove the placement groups (kill the pool's worker groups first)."""
        if self._pgs is None:
            return
        from ray.util.placement_group import remove_placement_group

        for pg in self._pgs:
            remove_placement_group(pg)
        self._pgs = None
