"""The process-group rendezvous of a worker group: rank 0 binds its TCP store on a port the OS assigns while
binding, and hands the port to the other ranks through Ray's key-value store.

Why: a port found free beforehand (bind, read, close) and bound again later is a race. Between the two, any
process on the machine may take it, and the ephemeral ports that gloo's own connections and other test runs
use come from the same range, so start-up failed at random with EADDRINUSE. Binding port 0 leaves nothing
to race for. The other ranks wait for the key (up to the init timeout); the group deletes it at shutdown.
Outside a worker group (torchrun, tests setting MASTER_PORT) the usual env:// rendezvous is used.
"""

from __future__ import annotations

import datetime
import os
import time

__all__ = ["RDZV_KEY_ENV", "rendezvous_store", "forget_rendezvous"]

RDZV_KEY_ENV = "HYBRIDRL_RDZV_KEY"
_POLL_S = 0.02


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def rendezvous_store(rank: int, world_size: int, timeout_s: float):
    """The TCPStore of this group: hosted by rank 0 on an OS-assigned port, joined by the others.

    Sets MASTER_PORT in this process to the port used, for code that reads it afterwards."""
    from torch.distributed import TCPStore

    key, host = os.environ[RDZV_KEY_ENV], os.environ["MASTER_ADDR"]
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = TCPStore(host, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        _kv()._internal_kv_put(key, str(store.port).encode(), overwrite=True)
        port = store.port
    else:
        port = _wait_for_port(key, timeout_s)
        store = TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    os.environ["MASTER_PORT"] = str(port)
    return store


def _wait_for_port(key: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        value = _kv()._internal_kv_get(key)
        if value is not None:
            return int(value)
        if time.monotonic() > deadline:
            raise TimeoutError(f"process-group rendezvous {key!r}: rank 0 did not publish its store port within "
                               f"{timeout_s}s (did rank 0 call init_distributed? is it alive?)")
        time.sleep(_POLL_S)


def forget_rendezvous(key: str) -> None:
    """Delete a group's rendezvous key (at shutdown; a missing key or a disconnected Ray is fine)."""
    try:
        _kv()._internal_kv_del(key)
    except Exception:  # Ray already shut down: the key went with it
        pass
