"""GPU only: the fused AdamW step the plan picks on GPUs equals the multi-tensor step and needs no temporary the
size of the optimizer state (the multi-tensor step holds sqrt(exp_avg_sq) of every tensor at once)."""

import pytest
import torch
from typed_sections import optim_section

from hybridrl.training.optim import build_optimizer

CFG = optim_section(lr=1e-3, weight_decay=0.01)


def _params(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(2048, 2048)] * 8 + [(2048,)] * 8
    return [torch.nn.Parameter(torch.randn(s, device="cuda", generator=g)) for s in shapes]


def _step_extra_bytes(params, opt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    opt.step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.gpu
def test_fused_adamw_equals_foreach_without_state_sized_temporaries():
    fused_p, foreach_p = _params(0), _params(0)
    fused = build_optimizer(fused_p, CFG, fused=True)
    foreach = build_optimizer(foreach_p, CFG, fused=False)
    assert fused.defaults["fused"] and not foreach.defaults["fused"]
    param_bytes = sum(p.numel() * p.element_size() for p in fused_p)
    for step in range(3):   # the first step creates the state; later ones show the steady-state temporaries
        fused_extra = _step_extra_bytes(fused_p, fused, step)
        foreach_extra = _step_extra_bytes(foreach_p, foreach, step)
    assert fused_extra < 0.05 * param_bytes, fused_extra / param_bytes
    assert foreach_extra > 0.9 * param_bytes, foreach_extra / param_bytes   # what the fused kernel avoids
    for a, b in zip(fused_p, foreach_p):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
