"""Ending a multi-process gloo group in tests without racing the other ranks."""

from datetime import timedelta

import torch.distributed as dist


def end_process_group(timeout_s: float = 60) -> None:
    """Wait for every rank (at most `timeout_s`), then destroy the default group.

    A rank that destroys its group while a peer is still inside a collective, or still holds its connection to the
    rank-0 store, can abort the peer at exit ("terminate called without an active exception", exit -6). The barrier
    closes that window; if a peer already failed, the barrier's timeout is swallowed so the failure itself is what the
    test reports.
    """
    if not dist.is_initialized():
        return
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
    except RuntimeError:
        pass
    dist.destroy_process_group()
