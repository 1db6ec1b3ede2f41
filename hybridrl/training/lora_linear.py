"""The LoRA linear's training forward and backward as one autograd function: y = x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ.

peft computes `base(x) + lora_B(lora_A(x)) * scaling`: besides the GEMMs it writes the adapter's [tokens, out]
product, scales it in a second pass and adds it in a third, and in backward scales the [tokens, out] gradient again
and sums two [tokens, in] input gradients. Each pass reads and writes a tensor as large as the layer's output (the
MLP's gate/up outputs are 5.3x the hidden size), so at a 7B shape they cost about as much memory traffic per layer
as the adapter GEMMs' own inputs. Here the scaled adapter product is accumulated into the base output by the GEMM
itself (`addmm_`, beta = 1, alpha = s), and likewise the adapter's input gradient into the base's; the scalings are
applied to [tokens, rank] and [rank, *] tensors only. Saved for backward: x and x·Aᵀ, as peft's graph saves them
(the frozen base weight is a reference, not a copy), so the memory model is unchanged.

`FusedLoraLinear` is peft's `lora.Linear` with this forward wherever it computes the same function: one active
vanilla adapter (no DoRA or other variant), no dropout, an `nn.Linear` base, one dtype for input, weight and
adapters, no autocast and no per-call arguments. Everything else (adapters disabled for the reference policy,
merged weights, mixed adapter batches) takes peft's own forward.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["lora_linear", "use_fused_forward"]


class _LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scaling: float):
        x2 = x.reshape(-1, x.shape[-1])
        h = x2 @ lora_a.t()                                   # [N, r]
        y = x2 @ weight.t() if bias is None else torch.addmm(bias, x2, weight.t())
        y.addmm_(h, lora_b.t(), alpha=scaling)                # y += s·h·Bᵀ inside the GEMM
        ctx.save_for_backward(x2, h, weight, lora_a, lora_b)
        ctx.scaling, ctx.has_bias = scaling, bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, h, weight, lora_a, lora_b = ctx.saved_tensors
        s = ctx.scaling
        g = grad.reshape(-1, grad.shape[-1])
        need_x, need_w, need_b, need_a, need_lb = ctx.needs_input_grad[:5]
        gh = g @ lora_b if (need_x or need_a) else None       # [N, r]: gradient of h, before the scaling
        grad_x = grad_w = grad_bias = grad_a = grad_lb = None
        if need_x:
            grad_x = (g @ weight).addmm_(gh, lora_a, alpha=s).view(*grad.shape[:-1], x2.shape[-1])
        if need_w:
            grad_w = g.t() @ x2
        if need_b and ctx.has_bias:
            grad_bias = g.sum(0)
        if need_a:
            grad_a = (gh.t() @ x2).mul_(s)                    # [r, in]
        if need_lb:
            grad_lb = (g.t() @ h).mul_(s)                     # [out, r]
        return grad_x, grad_w, grad_bias, grad_a, grad_lb, None


def lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """x·Wᵀ + bias + scaling·(x·Aᵀ)·Bᵀ with W [out, in], A [r, in], B [out, r]; one dtype for all."""
    return _LoraLinear.apply(x, weight, bias, lora_a, lora_b, float(scaling))


def _fused_forward_applies(layer, x: torch.Tensor, args, kwargs) -> str | None:
    """The active adapter's name where `lora_linear` computes what peft's forward would, else None."""
    if args or kwargs or layer.disable_adapters or layer.merged or torch.is_autocast_enabled(x.device.type):
        return None
    active = layer.active_adapters
    if len(active) != 1 or active[0] not in layer.lora_A or active[0] in layer.lora_variant:
        return None
    name = active[0]
    base = layer.base_layer
    if type(base) is not nn.Linear or layer.fan_in_fan_out or not isinstance(layer.lora_dropout[name], nn.Identity):
        return None
    dtypes = {x.dtype, base.weight.dtype, layer.lora_A[name].weight.dtype, layer.lora_B[name].weight.dtype}
    return name if len(dtypes) == 1 else None


def _fused_forward(self, x, *args, **kwargs):
    name = _fused_forward_applies(self, x, args, kwargs)
    if name is None:
        return _fused_class().__bases__[0].forward(self, x, *args, **kwargs)   # peft's own
    base = self.base_layer
    return lora_linear(x, base.weight, base.bias, self.lora_A[name].weight, self.lora_B[name].weight,
                       self.scaling[name])


def _fused_class() -> type:
    """peft's `lora.Linear` with the fused forward, made once (peft is an optional dependency) and published as
    this module's `FusedLoraLinear` so that a module holding it pickles by reference."""
    cls = globals().get("FusedLoraLinear")
    if cls is None:
        from peft.tuners.lora import Linear as PeftLinear

        cls = type("FusedLoraLinear", (PeftLinear,), {"forward": _fused_forward, "__module__": __name__})
        globals()["FusedLoraLinear"] = cls
    return cls


def use_fused_forward(layers) -> int:
    """Give every plain peft `lora.Linear` among `layers` the fused forward (its class is swapped in place for a
    subclass; parameters, names and state dict are untouched). Returns how many were switched."""
    fused = _fused_class()
    count = 0
    for layer in layers:
        if type(layer) is fused.__bases__[0]:
            layer.__class__ = fused
            count += 1
    return count
