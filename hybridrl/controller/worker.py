"""Worker: the base class of every process a worker group drives (one Ray actor per GPU / CPU bundle).

The group sets, before the user's ``__init__`` runs, the environment torch.distributed reads:
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (rank 0's node) and HYBRIDRL_RDZV_KEY. There is
no MASTER_PORT yet: ``init_distributed`` has rank 0 bind its store on a port the OS assigns and hands it to
the others (rendezvous.py), then sets MASTER_PORT. A ``Worker`` reads the env into ``rank``, ``world_size``,
``local_rank`` (position on its node) and ``device_index``.

Choices:
- GPU workers see only their own GPU: Ray sets CUDA_VISIBLE_DEVICES per actor, so the device is
  cuda:0 and LOCAL_RANK is exported as that device index (0), because code written for torchrun does
  ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``. Where all GPUs of the node are visible (a
  worker started outside Ray) the device index is the local rank, as under torchrun.
- ``init_distributed`` picks NCCL when CUDA is usable and gloo otherwise (a worker of a CPU pool counts
  as CPU even where the machine has GPUs: HYBRIDRL_USE_GPU=0), and always passes a timeout, so a
  collective waiting for a dead peer fails instead of hanging forever.
- Dispatch info per mesh (``set_dispatch_info``) is plain state on the worker that the group queries the
  first time a mesh-dispatched method is called.
- No Ray import at module level: worker classes can be imported (and unit-tested) without Ray.
"""

from __future__ import annotations

import datetime
import os
import socket

__all__ = ["Worker", "init_distributed", "use_cuda", "find_free_port", "node_ip_address"]

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
            "HYBRIDRL_USE_GPU")


def find_free_port() -> int:
    """A TCP port free on this host now (the OS picks it), for MASTER_PORT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip_address() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


def _visible_cuda_devices() -> list[str]:
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [v for v in value.split(",") if v.strip()]


def _device_index(local_rank: int) -> int:
    """Index of this worker's GPU among the visible ones: 0 when Ray pinned a single GPU."""
    visible = _visible_cuda_devices()
    if len(visible) == 1:
        return 0
    return local_rank


def use_cuda() -> bool:
    """CUDA is used when present, unless the group placed this worker on a CPU bundle (HYBRIDRL_USE_GPU=0):
    Ray leaves GPUs visible to actors that reserved none, and NCCL on them would be wrong."""
    import torch

    return os.environ.get("HYBRIDRL_USE_GPU", "1") != "0" and torch.cuda.is_available()


def init_distributed(timeout_s: float = 1800.0, backend: str | None = None) -> str:
    """Initialise the default process group from the env the group set: through the group's rendezvous
    (HYBRIDRL_RDZV_KEY, race-free port), else env:// (MASTER_PORT set by torchrun or the caller).

    Returns the backend used. Idempotent when already initialised with the same world size."""
    import torch
    import torch.distributed as dist

    from hybridrl.controller.rendezvous import RDZV_KEY_ENV, rendezvous_store

    port_source = RDZV_KEY_ENV if RDZV_KEY_ENV in os.environ else "MASTER_PORT"
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", port_source) if k not in os.environ]
    if missing:
        raise ValueError(f"init_distributed: environment variables {missing} are not set; start the "
                         "process through RayWorkerGroup (or torchrun) which sets them")
    if timeout_s <= 0:
        raise ValueError(f"init_distributed: timeout_s must be > 0, got {timeout_s}")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise ValueError(f"init_distributed: a process group of world size {dist.get_world_size()} "
                             f"already exists, env WORLD_SIZE is {world_size}")
        return dist.get_backend()
    cuda = use_cuda()
    backend = backend or ("nccl" if cuda else "gloo")
    if cuda and backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(seconds=timeout_s)
    if port_source == RDZV_KEY_ENV:
        store = rendezvous_store(rank, world_size, timeout_s)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=timeout)
    return backend


class Worker:
    """Base class for worker-group processes. Subclasses add ``@register``-ed methods."""

    def __init__(self, *args, **kwargs):
        self._read_env()

    def _read_env(self) -> None:
        if getattr(self, "_env_read", False):
            return
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("HYBRIDRL_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.device_index = _device_index(self.local_rank)
        os.environ["LOCAL_RANK"] = str(self.device_index)
        self._dispatch_info: dict[str, tuple[int, int, bool]] = {}
        self._env_read = True

    def init_distributed(self, timeout_s: float = 1800.0, backend: str | None = None) -> str:
        return init_distributed(timeout_s, backend)

    @property
    def device(self) -> str:
        return f"cuda:{self.device_index}" if use_cuda() else "cpu"

    # ---------------------------------------------------------------- mesh dispatch
    def set_dispatch_info(self, mesh_name: str, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declare this worker's place in mesh ``mesh_name`` for ``make_mesh_dispatch(mesh_name)``."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"set_dispatch_info({mesh_name!r}): dp_rank must be in [0, dp_size={dp_size}), "
                             f"got {dp_rank} on rank {self.rank}")
        self._read_env()
        self._dispatch_info[mesh_name] = (int(dp_rank), int(dp_size), bool(is_collect))

    def get_dispatch_info(self, mesh_name: str) -> tuple[int, int, bool] | None:
        self._read_env()
        return self._dispatch_info.get(mesh_name)

    def placement_info(self) -> dict:
        """Where this process runs: rank, node rank (its placement group), local rank and Ray node id."""
        import ray

        return {"rank": self.rank, "node_rank": int(os.environ.get("NODE_RANK", "0")), "local_rank": self.local_rank,
                "node_id": ray.get_runtime_context().get_node_id()}

    def get_env(self) -> dict[str, str]:
        """The distributed env and visible devices of this process (for diagnostics and tests)."""
        keys = ENV_KEYS + ("CUDA_VISIBLE_DEVICES",)
        return {k: os.environ[k] for k in keys if k in os.environ}
