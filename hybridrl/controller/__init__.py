"""Single controller on Ray: workers, dispatch modes, resource pools, worker groups.

``Worker``, ``register``, ``Dispatch`` and ``make_mesh_dispatch`` import without Ray (worker modules
need only these); the Ray-backed names load on first use.
"""

from hybridrl.controller.dispatch import Dispatch, MeshDispatch, make_mesh_dispatch, register
from hybridrl.controller.worker import Worker, init_distributed

_RAY_NAMES = {
    "RayResourcePool": "resource_pool",
    "init_ray": "resource_pool",
    "RayClassWithInitArgs": "worker_group",
    "RayWorkerGroup": "worker_group",
    "WorkerGroupFuture": "worker_group",
    "WorkerError": "worker_group",
    "WorkerDiedError": "worker_group",
}

__all__ = ["Dispatch", "MeshDispatch", "make_mesh_dispatch", "register", "Worker", "init_distributed",
           *_RAY_NAMES]


def __getattr__(name):
    if name in _RAY_NAMES:
        import importlib

        return getattr(importlib.import_module(f"hybridrl.controller.{_RAY_NAMES[name]}"), name)
    raise AttributeError(f"module 'hybridrl.controller' has no attribute {name!r}")
