"""The experts of an HF mixture-of-experts block in the training forward: two grouped GEMMs and a dispatch that
costs no more than moving each token's rows there and back.

Registered in transformers' experts interface as `hybridrl_grouped_mm` (training/moe.py `load_kwargs` asks for it
when an MoE model is loaded); it replaces transformers' own `grouped_mm` forward, which on the same GEMMs spends
more GPU time around them than in them (a Qwen3-30B-A3B update on an H200: three masked fills of [N·k, ·] tensors
per layer for expert parallelism, forward and backward, the k expert outputs weighted in an extra pass, and the
gather's backward as a sorting scatter-add).

Shapes: N tokens, k experts per token, S = N·k (token, expert) assignments, h hidden, Ie one expert's width.

Choices:
- The S assignments are sorted by expert (stable, so a recomputed forward under checkpointing routes identically);
  `offsets` end each expert's rows for torch's grouped matmul, which skips nothing and pads nothing.
- Tokens to assignments: each token's k rows gathered in expert order. Its backward gathers the k gradient rows of
  each token through the inverse permutation and sums them (deterministic, no atomics).
- The routing weight scales the SwiGLU product before the down projection instead of the down output after it (the
  projection is linear in its input), on k·Ie columns instead of k·h, in the same autograd node as the SwiGLU:
  it saves gate|up and the weights, recomputes the SiLU in backward and writes the gate|up gradient over its own
  saved input (nothing else reads it: the grouped GEMM's backward needs its input, not its output).
- Assignments to tokens: the down outputs back in token order, each token's k rows summed (fp32 accumulation);
  the backward is the first gather.
- What autograd keeps per token and layer: the k gathered rows (bf16 k·h), gate|up (2·k·Ie) and the down input
  (k·Ie), the k weights and two int32 index vectors (plan/model_shape.py counts them).
- Other expert modules fall back to transformers' own grouped-GEMM forward: biases, a post-expert norm, a gate
  other than SwiGLU on a concatenated [gate; up], experts split across ranks, or a torch without grouped matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["IMPLEMENTATION", "register", "experts_forward"]

IMPLEMENTATION = "hybridrl_grouped_mm"
_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


class _TokensToAssignments(torch.autograd.Function):
    """x [N, h] -> [S, h], row i = x[src[i]]; backward: each token's k gradient rows (found by `inv`) summed."""

    @staticmethod
    def forward(ctx, x, src, inv, k):
        ctx.save_for_backward(inv)
        ctx.k = k
        return x.index_select(0, src)

    @staticmethod
    def backward(ctx, grad):
        (inv,) = ctx.saved_tensors
        return grad.index_select(0, inv).view(-1, ctx.k, grad.shape[-1]).sum(1), None, None, None


class _AssignmentsToTokens(torch.autograd.Function):
    """y [S, h] in expert order -> [N, h], each token's k rows summed; backward: row i gets token src[i]'s gradient."""

    @staticmethod
    def forward(ctx, y, src, inv, k):
        ctx.save_for_backward(src)
        return y.index_select(0, inv).view(-1, k, y.shape[-1]).sum(1)

    @staticmethod
    def backward(ctx, grad):
        (src,) = ctx.saved_tensors
        return grad.index_select(0, src), None, None, None


class _WeightedSwiGLU(torch.autograd.Function):
    """gate_up [S, 2·Ie] = [gate; up], weights [S] -> silu(gate) · up · weight [S, Ie]."""

    @staticmethod
    def forward(ctx, gate_up, weights):
        gate, up = gate_up.chunk(2, dim=-1)
        ctx.save_for_backward(gate_up, weights)
        return F.silu(gate).mul_(up).mul_(weights.unsqueeze(-1))

    @staticmethod
    def backward(ctx, grad):
        gate_up, weights = ctx.saved_tensors
        gate, up = gate_up.chunk(2, dim=-1)
        w = weights.unsqueeze(-1)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        grad_silu = grad * silu                                   # d(out)/d(weight) before the sum over Ie
        grad_weights = (grad_silu * up).sum(-1)
        grad_up = grad_silu.mul_(w)                               # grad · silu · w
        # d silu / d gate = sig · (1 + gate · (1 - sig)) = sig + silu · (1 - sig)
        dsilu = silu.mul_(1 - sig).add_(sig)
        grad_gate = dsilu.mul_(grad).mul_(up).mul_(w)
        gate.copy_(grad_gate)                                     # over the saved input, which only this node reads
        up.copy_(grad_up)
        return gate_up, grad_weights.to(weights.dtype)


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, transposed: bool) -> torch.Tensor:
    """x [S, in] sorted by expert @ each expert's weight: [E, out, in] (HF's layout) or [E, in, out] (transposed)."""
    w = weight if transposed else weight.transpose(-2, -1)
    return _GROUPED_MM(x.to(w.dtype), w, offs=offsets)


def _supported(module) -> bool:
    from transformers.integrations import moe as hf_moe

    default_gate = getattr(type(module), "_apply_gate", None) is getattr(hf_moe, "_default_apply_gate", object())
    return (_GROUPED_MM is not None and getattr(module, "has_gate", False) and not getattr(module, "has_bias", False)
            and not getattr(module, "has_post_expert_norm", False) and not getattr(module, "_is_expert_parallel", False)
            and getattr(module, "is_concatenated", True) and default_gate
            and getattr(module.config, "hidden_act", None) in ("silu", "swish"))


def experts_forward(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
                    ) -> torch.Tensor:
    """An experts module's forward (transformers' signature): hidden_states [N, h], top_k_index / top_k_weights
    [N, k] -> [N, h] in hidden_states' dtype."""
    if not _supported(module):
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    k = top_k_index.shape[-1]
    experts = module.num_experts
    expert_ids, perm = torch.sort(top_k_index.reshape(-1), stable=True)
    counts_input = expert_ids.int() if expert_ids.is_cuda else expert_ids.float()   # histc: int on CUDA, float on CPU
    offsets = torch.cumsum(torch.histc(counts_input, bins=experts, min=0, max=experts - 1), 0, dtype=torch.int32)
    src = torch.div(perm, k, rounding_mode="floor").int()
    inv = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device)).int()

    rows = _TokensToAssignments.apply(hidden_states, src, inv, k)
    gate_up = _grouped_linear(rows, module.gate_up_proj, offsets, module.is_transposed)
    weights = top_k_weights.reshape(-1).index_select(0, perm).to(gate_up.dtype)
    act = _WeightedSwiGLU.apply(gate_up, weights)
    out = _grouped_linear(act, module.down_proj, offsets, module.is_transposed)
    return _AssignmentsToTokens.apply(out, src, inv, k).to(hidden_states.dtype)


def register() -> str:
    """Adds `hybridrl_grouped_mm` to transformers' experts interface (idempotent); returns its name."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(IMPLEMENTATION, experts_forward)
    return IMPLEMENTATION
