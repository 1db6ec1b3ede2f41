"""Log-probabilities (and entropy) of chosen tokens straight from hidden states, never holding [rows, vocab].

The plain path computes logits [K, V] in bf16, upcasts them, takes a log-softmax and keeps it for backward:
about 14 bytes per row per vocabulary entry — 0.5 GB per response row of a 152k vocabulary at 256 tokens,
which is what bounds micro-batch sizes of small models. Here rows go through the head in chunks of
`chunk_rows(V)`: forward keeps only the row's log-sum-exp, backward recomputes the chunk's logits and turns
them into the gradients of the hidden states and of the head weight (summed in fp32 inside each chunk's GEMM on
CUDA). Peak extra memory is one chunk of logits, whatever the micro-batch.

For z = (h @ W.T) / T, log p_t = z_t - lse(z) and entropy H = lse(z) - sum_j p_j z_j:
  d log p_t / dz = onehot(t) - p,   dH / dz = -p * (log p + H).
"""

from __future__ import annotations

import torch

CHUNK_BYTES = 256 << 20   # fp32 logits of one chunk


def chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_BYTES // (4 * vocab))


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits of one chunk, scaled in place (each pass over a chunk is 441 x 152k floats at 7B)."""
    z = (h @ weight.t()).float()
    return z if temperature == 1.0 else z.div_(temperature)


def _add_in_gemm(grad_w: torch.Tensor, dz: torch.Tensor, h: torch.Tensor) -> None:
    """grad_w += dz.T @ h summed into grad_w's dtype inside the GEMM (cuBLAS with a wider output: no [V, H]
    product in the compute dtype, no separate pass over grad_w)."""
    if dz.dtype == grad_w.dtype:
        grad_w.addmm_(dz.t(), h)
    else:
        torch.addmm(grad_w, dz.t(), h, out_dtype=grad_w.dtype, out=grad_w)


def _add_product(grad_w: torch.Tensor, dz: torch.Tensor, h: torch.Tensor) -> None:
    """grad_w += dz.T @ h through the [V, H] product in the compute dtype (for devices without the wider-output
    GEMM: torch has it on CUDA only)."""
    grad_w.add_(dz.t() @ h)


def add_weight_grad(grad_w: torch.Tensor, dz: torch.Tensor, h: torch.Tensor) -> None:
    """The head weight's fp32 gradient plus one chunk's [V, K] @ [K, H] contribution."""
    (_add_in_gemm if dz.dtype == grad_w.dtype or dz.is_cuda else _add_product)(grad_w, dz, h)


class _FusedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, entropy_grad: bool):
        rows, vocab = hidden.shape[0], weight.shape[0]
        out = torch.zeros(rows, 2, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        step = chunk_rows(vocab)
        for s in range(0, rows, step):
            z = _chunk_logits(hidden[s:s + step], weight, temperature)
            lse[s:s + step] = torch.logsumexp(z, dim=-1)
            out[s:s + step, 0] = z.gather(1, targets[s:s + step, None]).squeeze(1) - lse[s:s + step]
            if with_entropy:
                p = (z - lse[s:s + step, None]).exp_()
                out[s:s + step, 1] = lse[s:s + step] - torch.linalg.vecdot(p, z)
        ctx.save_for_backward(hidden, weight, targets, lse, out)
        ctx.temperature, ctx.entropy_grad = temperature, entropy_grad
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse, out = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        step = chunk_rows(weight.shape[0])
        for s in range(0, hidden.shape[0], step):
            h = hidden[s:s + step]
            log_p = _chunk_logits(h, weight, ctx.temperature).sub_(lse[s:s + step, None])
            p = log_p.exp()
            # dz = (g_lp * (onehot - p) - g_H * p * (log p + H)) / T, in place over the chunk's two fp32 buffers
            g_lp = grad_out[s:s + step, 0, None] / ctx.temperature
            if ctx.entropy_grad:
                g_h = grad_out[s:s + step, 1, None] / ctx.temperature
                dz = log_p.add_(out[s:s + step, 1, None]).mul_(-g_h).sub_(g_lp).mul_(p)
            else:
                dz = p.mul_(-g_lp)
            dz.scatter_add_(1, targets[s:s + step, None], g_lp)
            del log_p, p
            dz = dz.to(hidden.dtype)
            if need_h:
                grad_h[s:s + step] = dz @ weight
            if need_w:
                add_weight_grad(grad_w, dz, h)
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None, None


def fused_logprob_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                          with_entropy: bool, entropy_grad: bool = True) -> torch.Tensor:
    """[K, H] hidden states, [V, H] head weight, [K] target ids -> [K, 2] fp32 (log-prob, entropy or 0).
    entropy_grad=False: the entropy is a measurement, not part of the loss — it comes back detached, so
    backward skips its term (three of each chunk's passes over [rows, vocab])."""
    entropy_grad = bool(with_entropy and entropy_grad)
    out = _FusedLogProb.apply(hidden, weight, targets.long(), float(temperature), bool(with_entropy), entropy_grad)
    if with_entropy and not entropy_grad:   # the gradient reaching the entropy column is zero by construction
        out = torch.stack([out[:, 0], out[:, 1].detach()], dim=-1)
    return out


def plain_linear_head(module) -> bool:
    """True when the model's logits are exactly its output head (a bias-free linear layer) applied to the final
    hidden states — the case the fused path reproduces. Soft-capped or scaled logits take the plain path."""
    cfg = getattr(module, "config", None)
    head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    if cfg is None or not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    return all(getattr(cfg, k, None) in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale",
                                                             "output_multiplier_scale"))
