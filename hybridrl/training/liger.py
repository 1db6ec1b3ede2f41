"""Liger's fused Triton kernels on a training model (verl's `actor_rollout_ref.model.use_liger`).

HF's decoder layer runs RMSNorm as about eight elementwise passes in fp32 and SwiGLU as three; on a 7B LoRA
update the elementwise kernels, these passes among them, took a quarter of the GPU's time (docs/benchmarks.md
§0d). Liger (liger-kernel, a well-kept library) replaces them with one fused kernel each way: RMSNorm (fp32
statistics, the same "llama" casting as HF), SiLU·mul (recomputing the SiLU in backward instead of saving it) and
RoPE. Its fused linear cross-entropy is not used: the actor's log-prob head is training/fused_logprob.py.

Applied to the HF model after loading and before LoRA and FSDP; the module keeps its class and parameters.
Liger patches the instance and also the architecture's module classes, so a model of the same architecture built
later in the process (the reference policy, which shares the key) computes the same way.

RoPE runs Liger's Triton kernel. liger-kernel 0.8 picks RoPE's implementation per call among those importable, and
where NVIDIA's CuTe DSL (`cutlass`, which flash-attn-4 brings) imports on Hopper it takes a CuTe kernel whose compile
cache is keyed by the token count: packed micro-batches of variable length compile it anew, forward and backward,
in every micro-batch. The long-tail 1.5B update took 7.1-9.8 s that way against 5.2-6.9 s without the package
(benchmarks/results/long_tail/fa4_in_step). `apply_liger` therefore sets LIGER_KERNEL_IMPL_ROPE=nvidia-triton
unless the user set it (or its legacy name LIGER_KERNEL_BACKEND_ROPE); older Liger releases have no such choice.
"""

from __future__ import annotations

import importlib.util
import os

__all__ = ["LIGER_ARCHITECTURES", "liger_installed", "apply_liger"]

# HF model_type -> liger's apply function: the decoders the rollout engine runs (models/decoder.py)
KEY = "use_liger (actor_rollout_ref.model.use_liger; model.use_liger in SFT)"
LIGER_ARCHITECTURES = {"qwen2": "apply_liger_kernel_to_qwen2", "qwen3": "apply_liger_kernel_to_qwen3",
                       "llama": "apply_liger_kernel_to_llama", "mistral": "apply_liger_kernel_to_mistral"}


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


ROPE_ENV = "LIGER_KERNEL_IMPL_ROPE"   # liger-kernel >= 0.8: the implementation its RoPE dispatch takes


def pin_triton_rope() -> str | None:
    """Have Liger's RoPE run its Triton kernel (module notes) unless the user chose one; returns what RoPE will
    take by name, or None where this Liger has no per-op implementations (its RoPE is the Triton kernel)."""
    chosen = os.environ.get(ROPE_ENV) or os.environ.get("LIGER_KERNEL_BACKEND_ROPE")
    if chosen:
        return chosen
    try:
        from liger_kernel.backends.registry import get_registered
    except ImportError:
        return None
    if get_registered("rope", "nvidia-triton") is None:
        return None
    os.environ[ROPE_ENV] = "nvidia-triton"
    return "nvidia-triton"


def apply_liger(model) -> None:
    """Fused RMSNorm, SwiGLU and RoPE (Liger's Triton kernels) on `model` (an HF causal LM of a LIGER_ARCHITECTURES
    type), in place."""
    model_type = model.config.model_type
    if model_type not in LIGER_ARCHITECTURES:
        raise ValueError(f"{KEY}: no Liger kernels for model_type {model_type!r} "
                         f"(supported: {', '.join(LIGER_ARCHITECTURES)})")
    try:
        import liger_kernel.transformers as liger
    except ImportError as e:   # the plan saw the package on the driver; this worker cannot import it (or Triton)
        raise RuntimeError(f"{KEY}: liger-kernel does not import on this worker ({e}); "
                           "install it where the workers run, or set use_liger=false") from e
    pin_triton_rope()
    getattr(liger, LIGER_ARCHITECTURES[model_type])(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                                    fused_linear_cross_entropy=False, model=model)
