"""GPU bundles: each worker sees its own GPU as cuda:0 and NCCL all_reduce works across 2 GPUs."""

import pytest
import torch

from hybridrl.controller import Dispatch, Worker, register


class CudaWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def nccl_sum(self):
        import torch.distributed as dist

        backend = self.init_distributed(timeout_s=120)
        t = torch.full((4,), float(self.rank + 1), device=self.device)
        dist.all_reduce(t)
        return {"backend": backend, "sum": t[0].item(), "device": str(t.device), "local_rank": self.local_rank,
                "visible": self.get_env().get("CUDA_VISIBLE_DEVICES"), "LOCAL_RANK": self.get_env()["LOCAL_RANK"]}


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpu_workers_nccl(ray_local, ship_module_by_value):
    from hybridrl.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([2], use_gpu=True, cpus_per_bundle=0.5, name_prefix="test_gpu")
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(CudaWorker), worker_timeout_s=300)
    try:
        out = wg.nccl_sum()
    finally:
        wg.shutdown()
        pool.release()
    assert [o["backend"] for o in out] == ["nccl", "nccl"] and [o["sum"] for o in out] == [3.0, 3.0]
    assert [o["device"] for o in out] == ["cuda:0", "cuda:0"] and [o["LOCAL_RANK"] for o in out] == ["0", "0"]
    assert [o["local_rank"] for o in out] == [0, 1]
    assert len({o["visible"] for o in out}) == 2  # two different physical GPUs
