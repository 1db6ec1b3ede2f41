"""Log-probabilities of target tokens and softmax entropies, one chunk of rows at a time: the one routine behind
`logprobs_from_logits` / `entropy_from_logits` (algorithms/utils.py) and the fused log-prob head
(training/fused_logprob.py).

Shapes: N rows, V vocabulary.

For a row's fp32 logits z, with z' = z - max(z) (the same numbers for z + c as for z):
  log p_t = z'_t - lse(z'),   H = lse(z') - sum_j p_j z'_j,
  d log p_t / dz = onehot(t) - p,   dH / dz = -p * (log p + H).

Choices:
- One autograd function walks the rows in chunks of `chunk_rows(V)` rows (about CHUNK_BYTES of fp32 logits a
  chunk): forward keeps one fp32 row max, log-sum-exp and entropy a row; backward recomputes each chunk's logits.
  Peak extra memory is about two fp32 chunks, whatever N, instead of a full fp32 log_softmax of [N, V]
  (V = 152k, 8k rows: 5 GB).
- Where a chunk's logits come from, and where their gradient goes, is the caller's `source`: `GivenLogits` slices
  an existing [N, V] tensor of any dtype (its gradient comes back in that dtype); the fused head makes them from
  hidden states and the head weight, so [N, V] never exists. A source's logits are divided by its `temperature`,
  and the gradient it is handed is the one of its undivided logits.
- Logits that may hold -inf (`GivenLogits`: masked vocabularies) are max-subtracted: no cancellation between two
  large numbers, both terms of H are >= 0, and a p = 0 entry contributes 0 to H and to its gradient, not 0 * -inf.
- A source whose logits are finite (`finite = True`: the fused head's h @ W.T) skips the max and the p = 0 masks:
  torch.logsumexp is stable by itself, H = lse - p·z, and backward fuses both gradient terms — four fewer passes
  over each fp32 chunk, which on a GPU are most of the head's elementwise time.
- An entropy that is only measured (`entropy_grad=False`) comes back non-differentiable, and backward skips its
  term (three passes over each chunk).
- Each chunk's fp32 logits are a buffer of the routine's own, overwritten in place (shifted, then turned into
  probabilities or gradients), which keeps the two-chunk bound.
- A source may offer Triton kernels for its raw chunks (`kernels(inputs)`: the fused head on CUDA in bf16/fp16,
  training/triton_logprob.py): then each chunk is the source's undivided logits in their own dtype, forward is one
  kernel pass over it and backward one more that writes dz over it — the same finite formulas in fp32, without
  the fp32 chunk (two chunks in the compute dtype at most). Everything else (CPU, `GivenLogits`, HYBRIDRL_FUSED=0)
  takes the torch formulas above.
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_BYTES", "KERNEL_CHUNK_BYTES", "chunk_rows", "GivenLogits", "chunked_logprob_entropy",
           "chunked_sum_pi_squared"]

CHUNK_BYTES = 256 << 20   # fp32 logits of one chunk
# the kernel path's chunks hold 16-bit logits only, and its GEMMs run faster on more rows: 4x the rows for 2x the
# bytes of one fp32 chunk (the 1.5B head at 16k rows: 53 ms against 68 ms, benchmarks/fused_head.py)
KERNEL_CHUNK_BYTES = 512 << 20


def chunk_rows(vocab: int, chunk_size: int | None = None, kernels: bool = False) -> int:
    """Rows a chunk: chunk_size when given, else as many as CHUNK_BYTES of fp32 logits hold, or with `kernels`
    KERNEL_CHUNK_BYTES of 16-bit ones (at least one)."""
    if chunk_size is not None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}")
        return chunk_size
    if kernels:
        return max(1, KERNEL_CHUNK_BYTES // (2 * max(vocab, 1)))
    return max(1, CHUNK_BYTES // (4 * max(vocab, 1)))


class GivenLogits:
    """Chunks of logits that already exist: inputs = (logits [N, V],) of any dtype; the gradient comes back in it."""
    temperature = 1.0
    finite = False   # a caller may have masked entries to -inf

    @staticmethod
    def vocab(inputs: tuple[torch.Tensor, ...]) -> int:
        return inputs[0].shape[-1]

    @staticmethod
    def logits(inputs: tuple[torch.Tensor, ...], s: int, e: int) -> torch.Tensor:
        return inputs[0][s:e].to(torch.float32, copy=True)   # a copy even for fp32: it is overwritten in place

    @staticmethod
    def grad_dtype(inputs: tuple[torch.Tensor, ...]) -> torch.dtype:
        return inputs[0].dtype

    @staticmethod
    def kernels(inputs: tuple[torch.Tensor, ...]) -> None:
        return None   # the torch formulas: logits of any dtype, possibly -inf

    @staticmethod
    def new_grads(inputs: tuple[torch.Tensor, ...], needs: tuple[bool, ...]) -> list:
        return [torch.empty_like(inputs[0]) if needs[0] else None]

    @staticmethod
    def add_grads(inputs: tuple[torch.Tensor, ...], grads: list, s: int, e: int, dz: torch.Tensor) -> None:
        if grads[0] is not None:
            grads[0][s:e] = dz

    @staticmethod
    def finish_grads(inputs: tuple[torch.Tensor, ...], grads: list) -> tuple:
        return tuple(grads)


class _ChunkedLogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, source, targets, rows: int, with_entropy: bool, entropy_grad: bool, *inputs):
        n = inputs[0].shape[0]
        log_p = torch.zeros(n, dtype=torch.float32, device=inputs[0].device)
        ent, lse, row_max = torch.zeros_like(log_p), torch.empty_like(log_p), torch.empty_like(log_p)
        finite, kernels = source.finite, source.kernels(inputs)
        if finite:
            row_max.zero_()
        for s in range(0, n, rows):
            e = min(s + rows, n)
            if kernels is not None:   # one pass over the raw chunk
                kernels.logprob_entropy_forward(source.raw_logits(inputs, s, e),
                                                None if targets is None else targets[s:e], source.temperature,
                                                lse[s:e], log_p[s:e], ent[s:e] if with_entropy else None)
                continue
            z = source.logits(inputs, s, e)
            if not finite:
                row_max[s:e] = z.amax(dim=-1)
            shifted = z if finite else z.sub_(row_max[s:e, None])
            lse[s:e] = torch.logsumexp(shifted, dim=-1)
            if targets is not None:
                log_p[s:e] = shifted.gather(-1, targets[s:e, None]).squeeze(-1) - lse[s:e]
            if with_entropy and finite:
                p = (shifted - lse[s:e, None]).exp_()
                ent[s:e] = lse[s:e] - torch.linalg.vecdot(p, shifted)
                del p
            elif with_entropy:
                p = (shifted - lse[s:e, None]).exp_()
                live = p > 0
                ent[s:e] = lse[s:e] - p.mul_(shifted).masked_fill_(~live, 0.0).sum(-1)
                del p, live
            del z, shifted
        if targets is None:
            ctx.mark_non_differentiable(log_p)
        if not (with_entropy and entropy_grad):
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(*inputs, *(() if targets is None else (targets,)), lse, row_max, ent)
        ctx.source, ctx.rows, ctx.n_inputs = source, rows, len(inputs)
        ctx.with_log_p, ctx.entropy_grad = targets is not None, with_entropy and entropy_grad
        return log_p, ent

    @staticmethod
    def backward(ctx, grad_log_p, grad_ent):
        saved = ctx.saved_tensors
        inputs = saved[:ctx.n_inputs]
        targets = saved[ctx.n_inputs] if ctx.with_log_p else None
        lse, row_max, ent = saved[-3:]
        source, rows, n = ctx.source, ctx.rows, inputs[0].shape[0]
        grads = source.new_grads(inputs, ctx.needs_input_grad[5:])
        dtype, kernels = source.grad_dtype(inputs), source.kernels(inputs)
        for s in range(0, n, rows):
            e = min(s + rows, n)
            if kernels is not None:   # dz over the recomputed raw chunk, in its dtype
                dz = kernels.logprob_entropy_backward(
                    source.raw_logits(inputs, s, e), targets[s:e] if ctx.with_log_p else None, lse[s:e], ent[s:e],
                    grad_log_p[s:e] if ctx.with_log_p else None, grad_ent[s:e] if ctx.entropy_grad else None,
                    source.temperature)
                source.add_grads(inputs, grads, s, e, dz)
                del dz
                continue
            z = source.logits(inputs, s, e)
            log_p = (z if source.finite else z.sub_(row_max[s:e, None])).sub_(lse[s:e, None])
            p = log_p.exp()
            # in place over the chunk's two fp32 buffers: dz = g_lp * (onehot - p) - g_H * p * (log p + H)
            if ctx.entropy_grad and source.finite:
                g_h = grad_ent[s:e, None].float() / source.temperature
                g_lp = (grad_log_p[s:e, None].float() if ctx.with_log_p else torch.zeros_like(g_h)) \
                    / source.temperature
                dz = log_p.add_(ent[s:e, None]).mul_(-g_h).sub_(g_lp).mul_(p)
            elif ctx.entropy_grad:
                g_h = grad_ent[s:e, None].float() / source.temperature
                live = p > 0
                dz = log_p.add_(ent[s:e, None]).mul_(p).neg_().masked_fill_(~live, 0.0).mul_(g_h)
                del live
                if ctx.with_log_p:
                    g_lp = grad_log_p[s:e, None].float() / source.temperature
                    dz.sub_(p.mul_(g_lp))
            else:
                g_lp = grad_log_p[s:e, None].float() / source.temperature
                dz = p.mul_(-g_lp)
            if ctx.with_log_p:
                dz.scatter_add_(-1, targets[s:e, None], g_lp)
            del z, log_p, p
            dz = dz.to(dtype)   # the fp32 chunk is freed here when the inputs are narrower
            source.add_grads(inputs, grads, s, e, dz)
            del dz
        return (None, None, None, None, None, *source.finish_grads(inputs, grads))


def chunked_logprob_entropy(source, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor | None,
                            with_entropy: bool, entropy_grad: bool = True,
                            chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of targets [N] fp32, or zeros without targets; entropy [N] fp32, or zeros without with_entropy)
    of the logits that `source` makes from `inputs` (their first dimension is N), chunk_size rows at a time
    (default `chunk_rows(V)`). The log-probs are differentiable when targets are given, the entropy when
    with_entropy and entropy_grad.

    A source (see `GivenLogits`) has `temperature`, `finite` (no -inf logits), `vocab(inputs)`, `logits(inputs, s, e)` (rows s:e as a fresh
    fp32 [e-s, V] buffer, already divided by the temperature), `grad_dtype(inputs)`, `new_grads(inputs, needs)`,
    `add_grads(inputs, grads, s, e, dz)` (dz: the rows' gradient of the undivided logits, in grad_dtype),
    `finish_grads(inputs, grads)` (one gradient or None per input) and `kernels(inputs)`: None, or the module of
    Triton kernels (training/triton_logprob.py) for a finite source that then also has `raw_logits(inputs, s, e)`
    (rows s:e, fresh, undivided, in grad_dtype), used instead of `logits`."""
    rows = chunk_rows(source.vocab(inputs), chunk_size, kernels=source.kernels(inputs) is not None)
    targets = None if targets is None else targets.reshape(-1).long()
    return _ChunkedLogProbEntropy.apply(source, targets, rows, bool(with_entropy), bool(entropy_grad), *inputs)


@torch.no_grad()
def chunked_sum_pi_squared(source, inputs: tuple[torch.Tensor, ...], chunk_size: int | None = None) -> torch.Tensor:
    """Σ_v softmax(z)_v² [N] fp32 of the logits `source` makes from `inputs` (a measurement: no gradient), chunk by
    chunk through the torch formulas: exp(lse(2z') - 2 lse(z')) on z' = z - max(z) (exact in fp32), so two large
    log-sum-exps never cancel; -inf entries add nothing."""
    n = inputs[0].shape[0]
    out = torch.empty(n, dtype=torch.float32, device=inputs[0].device)
    rows = chunk_rows(source.vocab(inputs), chunk_size)
    for s in range(0, n, rows):
        e = min(s + rows, n)
        z = source.logits(inputs, s, e)
        z.sub_(z.amax(dim=-1, keepdim=True))
        lse = torch.logsumexp(z, dim=-1)
        out[s:e] = torch.exp(torch.logsumexp(z.mul_(2.0), dim=-1) - 2.0 * lse)
        del z
    return out
