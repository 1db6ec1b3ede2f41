"""The process-group port is bound by rank 0 itself, so a port taken by another process between the group's
start and init_distributed cannot break start-up (CI once failed with EADDRINUSE there)."""

import socket

import pytest
import torch

from hybridrl.controller import Dispatch, Worker, register


class RendezvousWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def env(self):
        return self.get_env()

    @register(Dispatch.ONE_TO_ALL)
    def init_and_sum_ranks(self):
        import torch.distributed as dist

        self.init_distributed(timeout_s=30)
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return t.item(), self.get_env()["MASTER_PORT"]


def squat(port: int) -> socket.socket:
    """A listening socket on `port` of every interface: what another process grabbing the port looks like."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", port))
    s.listen()
    return s


@pytest.mark.parametrize("attempt", range(2))  # a second group right after the first: no leftover key or port
def test_a_port_taken_before_init_does_not_break_the_rendezvous(cpu_pool, ship_module_by_value, attempt):
    from hybridrl.controller import RayClassWithInitArgs, RayWorkerGroup

    wg = RayWorkerGroup(cpu_pool, RayClassWithInitArgs(RendezvousWorker), name_prefix=f"rdzv{attempt}",
                        worker_timeout_s=60)
    squatters = []
    try:
        # any port the group announces before init is a port someone else can take first: take it
        announced = {e["MASTER_PORT"] for e in wg.env() if "MASTER_PORT" in e}
        squatters = [squat(int(p)) for p in announced]
        results = wg.init_and_sum_ranks()
        assert [total for total, _ in results] == [3.0, 3.0]
        ports = {port for _, port in results}
        assert len(ports) == 1 and int(ports.pop()) not in {int(p) for p in announced}
    finally:
        for s in squatters:
            s.close()
        wg.shutdown()
