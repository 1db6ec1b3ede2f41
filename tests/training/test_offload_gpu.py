"""GPU only: optimizer offload to pinned host memory and back leaves AdamW's next step exactly as without it, for
FSDP2's DTensor state and plain tensors, and reuses the same pinned buffers at every offload; parameter offload frees
the parameters' device memory and brings back the same tensors with the same values."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from hybridrl.training.offload import load_fsdp_params, load_optimizer, offload_fsdp_params, offload_optimizer


@pytest.fixture
def one_rank_mesh():
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cuda", (1,))
    if made:
        dist.destroy_process_group()


def _params(mesh, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    full = [torch.randn(s, device="cuda", generator=g) for s in ((256, 64), (64,), (33, 7))]
    out = [torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)])) for t in full[:2]]
    return out + [torch.nn.Parameter(full[2])]   # one plain tensor beside the DTensors


def _step(params, opt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for p in params:
        grad = torch.randn(p.shape, device="cuda", generator=g)
        p.grad = distribute_tensor(grad, p.device_mesh, p.placements) if isinstance(p, DTensor) else grad
    opt.step()


def _locals(opt):
    return [v.to_local() if isinstance(v, DTensor) else v
            for s in opt.state.values() for k, v in s.items() if k != "step"]


@pytest.mark.gpu
def test_offload_round_trip_is_exact_and_reuses_pinned_buffers(one_rank_mesh):
    moved, kept = _params(one_rank_mesh, 0), _params(one_rank_mesh, 0)
    opt_moved, opt_kept = (torch.optim.AdamW(ps, lr=1e-2, foreach=False) for ps in (moved, kept))  # DTensor beside Tensor
    pointers = None
    for step in range(3):
        _step(moved, opt_moved, step)
        _step(kept, opt_kept, step)
        offload_optimizer(opt_moved)
        host = _locals(opt_moved)
        assert all(t.device.type == "cpu" and t.is_pinned() for t in host)
        assert all(isinstance(v, DTensor) == isinstance(p, DTensor)
                   for p, s in opt_moved.state.items() for k, v in s.items() if k != "step")
        for a, b in zip(host, _locals(opt_kept)):
            torch.testing.assert_close(a, b.cpu(), atol=0, rtol=0)
        ptrs = [t.data_ptr() for t in host]
        assert pointers is None or ptrs == pointers   # pinned once, reused
        pointers = ptrs
        load_optimizer(opt_moved, "cuda")
        assert all(t.is_cuda for t in _locals(opt_moved))
    _step(moved, opt_moved, 9)
    _step(kept, opt_kept, 9)
    for a, b in zip(moved, kept):
        torch.testing.assert_close(a.detach(), b.detach(), atol=0, rtol=0)


@pytest.mark.gpu
def test_param_offload_frees_device_memory_and_restores_the_same_tensors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    model[2].weight = torch.nn.Parameter(model[0].weight.t())   # a parameter viewing another's storage
    x = torch.randn(8, 1024, device="cuda")
    want = model(x)
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params[:2] + params[3:])
    for _ in range(2):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        offload_fsdp_params(model)
        assert before - torch.cuda.memory_allocated() >= param_bytes
        load_fsdp_params(model, "cuda")
        assert torch.cuda.memory_allocated() == before
        assert all(a is b for a, b in zip(params, model.parameters())) and all(p.is_cuda for p in params)
        torch.testing.assert_close(model(x), want, atol=0, rtol=0)
