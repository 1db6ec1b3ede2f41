"""Failure paths: a failing peer in a collective, a hung call (timeout), a killed worker, a failing __init__."""

import time

import pytest
import torch

from hybridrl.controller import Dispatch, Worker, register


class FragileWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def reduce_unless(self, bad_rank: int):
        import torch.distributed as dist

        if self.rank == bad_rank:
            raise RuntimeError(f"rank {bad_rank} gives up before the collective")
        self.init_distributed(timeout_s=5)  # waits for the peer that never comes
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    @register(Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float):
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def ping(self):
        return self.rank


class BrokenInitWorker(Worker):
    def __init__(self):
        super().__init__()
        if self.rank == 1:
            raise ValueError("bad config on rank 1")


def test_failing_peer_then_hang_then_killed_worker(cpu_pool, ship_module_by_value):
    import ray

    from hybridrl.controller import RayClassWithInitArgs, RayWorkerGroup, WorkerDiedError, WorkerError

    wg = RayWorkerGroup(cpu_pool, RayClassWithInitArgs(FragileWorker), worker_timeout_s=60)
    try:
        # rank 0 waits in the rendezvous for rank 1, which raised: the error of rank 1 is reported at once
        with pytest.raises(WorkerError) as info:
            wg.reduce_unless(1)
        assert info.value.rank == 1 and "gives up" in str(info.value)

        wg.worker_timeout_s = 1.0  # trainer.worker_timeout_s
        with pytest.raises(TimeoutError, match=r"nap.*ranks \[0, 1\].*1.0s"):
            wg.nap(60)

        wg.worker_timeout_s = 60.0
        ray.kill(wg.workers[1], no_restart=True)
        with pytest.raises(WorkerDiedError, match=r"rank 1 .*died.*'ping'") as died:
            wg.ping()  # rank 0 is still napping; the dead rank ends the call
        assert died.value.rank == 1
    finally:
        wg.shutdown()


def test_failing_init_names_rank(cpu_pool, ship_module_by_value):
    from hybridrl.controller import RayClassWithInitArgs, RayWorkerGroup, WorkerError

    with pytest.raises(WorkerError, match=r"rank 1 .*__init__") as info:
        RayWorkerGroup(cpu_pool, RayClassWithInitArgs(BrokenInitWorker), worker_timeout_s=60)
    assert "bad config on rank 1" in str(info.value)


def test_user_errors_are_value_errors(cpu_pool):
    from hybridrl.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    with pytest.raises(ValueError, match="subclass of hybridrl.controller.Worker"):
        RayClassWithInitArgs(dict)
    with pytest.raises(ValueError, match="process_on_nodes"):
        RayResourcePool([0], use_gpu=False)
    with pytest.raises(ValueError, match="worker_timeout_s"):
        RayWorkerGroup(cpu_pool, RayClassWithInitArgs(FragileWorker), worker_timeout_s=0)
