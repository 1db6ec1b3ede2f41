"""Resharding FSDP → TP on 2 gloo ranks: every rank receives exactly its TP slice of every tensor."""

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import end_process_group
from test_hybrid_engine import run_two_ranks
from torch import nn
from tp_slicing_engine import SlicingEngine


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
    end_process_group()


@pytest.mark.parametrize("strategy", ["slice", "gather"])
def test_reshard_delivers_each_rank_its_slice(strategy):
    results = run_two_ranks(_worker, strategy)
    for rank, errors, nbytes, ntensors in results:
        assert errors == [], f"rank {rank}: {errors}"
        assert ntensors == 6
        assert nbytes > 0
    if strategy == "slice":
        # rank 0 needs col rows 0..3 which it holds itself; it receives only row.* columns from rank 1 and replicated parts
        total_full = (7 * 6 + 7 + 8 * 5 + 5 + 5 + 5) * 4
        assert all(nbytes < total_full / 2 for _, _, nbytes, _ in results)


class ExpertsNet(nn.Module):
    """HF's fused expert tensors: gate_up_proj [E, 2I, H], down_proj [E, H, I] (I = 4, H = 5)."""

    def __init__(self, num_experts):
        super().__init__()
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.randn(num_experts, 2 * 4, 5))
        self.experts.down_proj = nn.Parameter(torch.randn(num_experts, 5, 4))


class ExpertsEngine:
    """An engine holding one TP MoE `Experts` module: its shard specs, its loader."""

    def __init__(self, experts):
        self.experts, self.received = experts, {}

    def weight_shard_spec(self, name, shape):
        return self.experts.shard_spec(name.rpartition(".")[2], None)

    def load_weights(self, weights):
        for name, t in weights:
            self.received[name] = t.clone()
            self.experts.load(name.rpartition(".")[2], t)


def _experts_worker(rank, world, port, expert_parallel, q):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hybridrl.hybrid.reshard import FSDPToTPResharder
    from hybridrl.models.moe import Experts
    from hybridrl.models.tp_layers import narrow_spec

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    num_experts = 4 if expert_parallel else 3  # 3: uneven over the 2 FSDP ranks; 4: two whole experts per TP rank
    net = ExpertsNet(num_experts)
    full = {n: p.detach().clone() for n, p in net.named_parameters()}
    fully_shard(net, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",)))
    experts = Experts(num_experts, 5, 4, dist.new_group([0, 1]), expert_parallel)
    experts.to_empty(device="cpu")
    engine = ExpertsEngine(experts)
    stats = FSDPToTPResharder(net, engine, torch.float32, torch.device("cpu"), strategy="slice").reshard()
    errors = []
    for name, tensor in full.items():
        want = narrow_spec(tensor, engine.weight_shard_spec(name, tensor.shape))
        got = engine.received[name]
        held = getattr(experts, name.rpartition(".")[2])
        if got.shape != want.shape or not torch.equal(got, want) or not torch.equal(held, want):
            errors.append(f"{name}: got {tuple(got.shape)} want {tuple(want.shape)}")
    q.put((rank, errors, stats.bytes_received))
    end_process_group()


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_reshard_delivers_each_rank_its_experts_slice(expert_parallel):
    """TP over the experts' intermediate size: a rank receives its gate rows and the same up rows of every expert
    (two ranges of dim 1) and its down columns; expert parallel: its whole experts (dim 0), which here are the very
    rows FSDP gave it, so nothing moves."""
    results = run_two_ranks(_experts_worker, expert_parallel)
    for rank, errors, nbytes in results:
        assert errors == [], f"rank {rank}: {errors}"
        assert (nbytes == 0) if expert_parallel else (nbytes > 0)
