"""Resharding FSDP → TP on 2 gloo ranks: every rank receives exactly its TP slice of every tensor."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from tp_slicing_engine import SlicingEngine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_engine(rank, world):
    """Column-parallel for 'col.*', row-parallel for 'row.*' (2-D), replicated otherwise (like norms)."""
    return SlicingEngine(rank, world, column=lambda name, shape: name.startswith("col."),
                         row=lambda name, shape: name.startswith("row.") and len(shape) == 2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.col = nn.Linear(6, 7)  # 7 rows: uneven over 2 FSDP ranks and 2 TP ranks
        self.row = nn.Linear(8, 5)
        self.norm = nn.LayerNorm(5)


def _worker(rank, world, port, strategy, q):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hybridrl.hybrid.reshard import FSDPToTPResharder

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = Net()
    full = {n: p.detach().clone() for n, p in net.named_parameters()}
    fully_shard(net, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",)))
    engine = fake_engine(rank, world)
    stats = FSDPToTPResharder(net, engine, torch.float32, torch.device("cpu"), strategy=strategy).reshard()
    errors = []
    for name, tensor in full.items():
        spec = engine.weight_shard_spec(name, tuple(tensor.shape))
        got = engine.received[name]
        if spec is not None and strategy == "slice":
            dim, start, length = spec
            want = tensor.narrow(dim, start, length)
        else:
            want = tensor
        if got.shape != want.shape or not torch.equal(got, want):
            errors.append(f"{name}: got {tuple(got.shape)} want {tuple(want.shape)}")
    q.put((rank, errors, stats.bytes_received, stats.tensors))
    dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["slice", "gather"])
def test_reshard_delivers_each_rank_its_slice(strategy):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, strategy, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, errors, nbytes, ntensors in results:
        assert errors == [], f"rank {rank}: {errors}"
        assert ntensors == 6
        assert nbytes > 0
    if strategy == "slice":
        # rank 0 needs col rows 0..3 which it holds itself; it receives only row.* columns from rank 1 and replicated parts
        total_full = (7 * 6 + 7 + 8 * 5 + 5 + 5 + 5) * 4
        assert all(nbytes < total_full / 2 for _, _, nbytes, _ in results)
