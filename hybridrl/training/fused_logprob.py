"""Log-probabilities (and entropy) of chosen tokens straight from hidden states, never holding [rows, vocab].

The plain path computes logits [K, V] in bf16, upcasts them, takes a log-softmax and keeps it for backward:
about 14 bytes per row per vocabulary entry — 0.5 GB per response row of a 152k vocabulary at 256 tokens,
which is what bounds micro-batch sizes of small models. Here rows go through the head in chunks of
`chunk_rows(V)` (algorithms/chunked_logprob.py, the routine `logprobs_from_logits` runs too, with z = (h @ W.T) / T
as its logits): forward keeps a few fp32 numbers a row, backward recomputes the chunk's logits and turns them into
the gradients of the hidden states and of the head weight.

Choices:
- The head weight's gradient is summed in fp32 across chunks, inside each chunk's GEMM on CUDA
  (`add_weight_grad`), and returned in the weight's dtype; the hidden states' gradient has their dtype.
- On CUDA in bf16/fp16 with Triton importable (and HYBRIDRL_FUSED not 0), the chunks' elementwise work is
  training/triton_logprob.py's two kernels over the raw bf16 chunk (`_HeadLogits.kernels`): one read in forward,
  one read and write in backward, instead of about ten fp32 passes — the same formulas in fp32. Elsewhere (CPU,
  fp32 weights, HYBRIDRL_FUSED=0) the torch formulas of algorithms/chunked_logprob.py run.
- Peak extra memory is about two chunks of logits, whatever the micro-batch: fp32 on the torch path, the
  compute dtype with the kernels.
"""

from __future__ import annotations

from types import ModuleType

import torch

from hybridrl.algorithms.chunked_logprob import chunked_logprob_entropy, chunked_sum_pi_squared
from hybridrl.models import fused


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


class _HeadLogits:
    """A chunk's logits made from inputs = (hidden [K, H], head weight [V, H]): (h @ W.T) / T in fp32; the gradient
    goes to both (the weight's summed in fp32 across chunks)."""

    finite = True    # h @ W.T: no -inf entries, so the routine's cheaper formulas apply

    def __init__(self, temperature: float):
        self.temperature = temperature

    @staticmethod
    def vocab(inputs: tuple[torch.Tensor, ...]) -> int:
        return inputs[1].shape[0]

    @staticmethod
    def raw_logits(inputs: tuple[torch.Tensor, ...], s: int, e: int) -> torch.Tensor:
        """One chunk's h @ W.T in the compute dtype, undivided."""
        hidden, weight = inputs
        return hidden[s:e] @ weight.t()

    def logits(self, inputs: tuple[torch.Tensor, ...], s: int, e: int) -> torch.Tensor:
        """fp32 logits of one chunk, scaled in place (each pass over a chunk is 441 x 152k floats at 7B)."""
        z = self.raw_logits(inputs, s, e).float()
        return z if self.temperature == 1.0 else z.div_(self.temperature)

    @staticmethod
    def kernels(inputs: tuple[torch.Tensor, ...]) -> ModuleType | None:
        """The Triton kernels for raw chunks where they run (CUDA, or HYBRIDRL_FUSED=force under the interpreter;
        a 16-bit compute dtype), else None: the torch formulas."""
        hidden = inputs[0]
        if not (fused.enabled(hidden) and hidden.dtype in (torch.bfloat16, torch.float16)):
            return None
        from hybridrl.training import triton_logprob

        return triton_logprob

    @staticmethod
    def grad_dtype(inputs: tuple[torch.Tensor, ...]) -> torch.dtype:
        return inputs[0].dtype

    @staticmethod
    def new_grads(inputs: tuple[torch.Tensor, ...], needs: tuple[bool, ...]) -> list:
        hidden, weight = inputs
        return [torch.empty_like(hidden) if needs[0] else None,
                torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs[1] else None]

    @staticmethod
    def add_grads(inputs: tuple[torch.Tensor, ...], grads: list, s: int, e: int, dz: torch.Tensor) -> None:
        hidden, weight = inputs
        if grads[0] is not None:
            grads[0][s:e] = dz @ weight
        if grads[1] is not None:
            add_weight_grad(grads[1], dz, hidden[s:e])

    @staticmethod
    def finish_grads(inputs: tuple[torch.Tensor, ...], grads: list) -> tuple:
        return grads[0], (None if grads[1] is None else grads[1].to(inputs[1].dtype))


def fused_logprob_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                          with_entropy: bool, entropy_grad: bool = True) -> torch.Tensor:
    """[K, H] hidden states, [V, H] head weight, [K] target ids -> [K, 2] fp32 (log-prob, entropy or 0).
    entropy_grad=False: the entropy is a measurement, not part of the loss — it comes back detached, so
    backward skips its term (three of each chunk's passes over [rows, vocab])."""
    log_p, entropy = chunked_logprob_entropy(_HeadLogits(float(temperature)), (hidden, weight), targets,
                                             with_entropy, entropy_grad)
    return torch.stack([log_p, entropy], dim=-1)


def fused_sum_pi_squared(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """[K, H] hidden states, [V, H] head weight -> [K] fp32 Σ softmax(h @ W.T / T)², chunk by chunk, no gradient."""
    return chunked_sum_pi_squared(_HeadLogits(float(temperature)), (hidden, weight))


def plain_linear_head(module) -> bool:
    """True when the model's logits are exactly its output head (a bias-free linear layer) applied to the final
    hidden states — the case the fused path reproduces. Soft-capped or scaled logits take the plain path."""
    cfg = getattr(module, "config", None)
    head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    if cfg is None or not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    return all(getattr(cfg, k, None) in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale",
                                                             "output_multiplier_scale"))
