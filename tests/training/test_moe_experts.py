"""hybridrl's grouped-GEMM experts forward (training/moe_experts.py) against transformers' own grouped-GEMM forward on
the same module: outputs and every gradient (hidden states, routing weights, expert tensors), on CPU and, where
there is one, on a GPU in bf16; its autograd nodes against torch's autograd in float64; the fallback to
transformers' forward for experts it does not cover."""

import copy

import pytest
import torch
import transformers
from _training_tiny import tiny_moe_config
from transformers.integrations.moe import grouped_mm_experts_forward

from hybridrl.training import moe_experts
from hybridrl.training.moe_experts import (
    _AssignmentsToTokens,
    _TokensToAssignments,
    _WeightedSwiGLU,
    experts_forward,
)

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="needs a CUDA GPU")])]
# bf16 on a GPU: both paths round differently (the weight before vs after the down projection, bf16 temporaries)
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _experts(kind, dtype, device, **config):
    cfg = tiny_moe_config(kind)
    for key, value in config.items():
        setattr(cfg, key, value)
    cfg._experts_implementation = moe_experts.register()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.model.layers[0].mlp.experts.to(device)


def _run(forward, module, x, ids, weights):
    x, weights = x.clone().requires_grad_(), weights.clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    out = forward(module, x, ids, weights)
    torch.manual_seed(1)
    (out.float() * torch.randn_like(out, dtype=torch.float32)).sum().backward()
    return out.detach(), x.grad, weights.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def _routing(n, experts, k, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(n)]).to(device)
    ids[: n // 4] = ids[0]                      # a crowded expert pair beside empty experts
    weights = torch.rand(n, k, generator=g).softmax(-1).to(device, dtype)
    return ids, weights


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_equals_transformers_grouped_mm_forward_and_gradients(kind, device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    module = _experts(kind, dtype, device)
    assert moe_experts._supported(module)
    n = 200
    x = torch.randn(n, module.gate_up_proj.shape[-1], device=device, dtype=dtype)
    ids, weights = _routing(n, module.num_experts, 2, dtype, device)
    ours = _run(experts_forward, module, x, ids, weights)
    hf = _run(grouped_mm_experts_forward, copy.deepcopy(module), x, ids, weights)
    for a, b, what in zip(ours[:3], hf[:3], ("output", "d hidden", "d routing weights")):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **TOL[dtype], msg=what)
    assert ours[3].keys() == hf[3].keys() and ours[3]
    for name, grad in hf[3].items():
        torch.testing.assert_close(ours[3][name].float(), grad.float(), **TOL[dtype], msg=name)
    assert torch.equal(_run(experts_forward, module, x, ids, weights)[0], ours[0])   # deterministic (recompute)


def test_autograd_nodes_equal_torch_autograd_in_float64():
    torch.manual_seed(0)
    n, k, h, ie = 7, 3, 5, 4
    x = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    perm = torch.randperm(n * k)
    src, inv = (perm // k).int(), torch.argsort(perm).int()
    assert torch.autograd.gradcheck(lambda t: _TokensToAssignments.apply(t, src, inv, k), (x,))
    y = torch.randn(n * k, h, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _AssignmentsToTokens.apply(t, src, inv, k), (y,))
    torch.testing.assert_close(_AssignmentsToTokens.apply(y, src, inv, k),
                               torch.zeros(n, h, dtype=torch.float64).index_add(0, src.long(), y))
    # the SwiGLU node writes its gradient over its saved input, so it can run backward once (gradcheck's
    # repeated backward cannot): its gradients against autograd's through the plain formula
    gate_up = torch.randn(n * k, 2 * ie, dtype=torch.float64)
    w = torch.rand(n * k, dtype=torch.float64)
    grad_out = torch.randn(n * k, ie, dtype=torch.float64)
    grads = []
    for fn in (lambda a, b: _WeightedSwiGLU.apply(a.clone(), b),
               lambda a, b: torch.nn.functional.silu(a[:, :ie]) * a[:, ie:] * b[:, None]):
        a, b = gate_up.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(a, b)
        (out * grad_out).sum().backward()
        grads.append((out.detach(), a.grad, b.grad))
    for ours, ref in zip(*grads):
        torch.testing.assert_close(ours, ref, atol=1e-12, rtol=1e-10)


def test_other_experts_take_transformers_forward():
    module = _experts("qwen3_moe", torch.float32, "cpu", hidden_act="gelu")
    assert not moe_experts._supported(module)
    x = torch.randn(30, module.gate_up_proj.shape[-1])
    ids, weights = _routing(30, module.num_experts, 2, torch.float32, "cpu")
    assert torch.equal(experts_forward(module, x, ids, weights), grouped_mm_experts_forward(module, x, ids, weights))
