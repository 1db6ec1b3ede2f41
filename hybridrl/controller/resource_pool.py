"""Ray resources: connecting to Ray (``init_ray``) and reserving bundles (``RayResourcePool``).

A pool holds one placement group per node (STRICT_PACK), one bundle per GPU, or one CPU bundle per
process when ``use_gpu=False`` so that everything also runs on CPU-only machines. A worker group places
one actor per bundle, in rank order (node 0's bundles first). ``max_colocate_count`` actors may share a
bundle: each takes 1/max_colocate_count of it, which lets a second role share the GPUs of the first
(the usual colocation is one worker class composing several roles in one process, as verl's
ActorRolloutRefWorker does; a role can also get its own pool).

Choices: placement groups are created lazily and waited on with a timeout, so a pool asking for more
than the cluster has fails with the numbers in the message instead of waiting forever. With
``n_gpus_per_node`` equal to a node's GPU count, STRICT_PACK forces one placement group per machine.
"""

from __future__ import annotations

import os
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
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus, **kwargs)
    return dict(ray.cluster_resources())


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
        from ray.util.placement_group import placement_group, remove_placement_group

        pgs = [placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name_prefix}_node{i}")
               for i, n in enumerate(self.process_on_nodes)]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise ValueError(f"RayResourcePool {self.name_prefix!r}: could not reserve {self.process_on_nodes} "
                             f"bundles of {self.bundle()} (one placement group per node) within "
                             f"{self.placement_timeout_s}s; the cluster has {ray.available_resources()} free of "
                             f"{ray.cluster_resources()}. Check trainer.nnodes / trainer.n_gpus_per_node") from None
        self._pgs = pgs
        return pgs

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
