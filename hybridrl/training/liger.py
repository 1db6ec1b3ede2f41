"""Liger's fused Triton kernels on a training model (verl's `actor_rollout_ref.model.use_liger`).

HF's decoder layer runs RMSNorm as about eight elementwise passes in fp32 and SwiGLU as three; on a 7B LoRA
update the elementwise kernels, these passes among them, took a quarter of the GPU's time (docs/benchmarks.md
§0d). Liger (liger-kernel, a well-kept library) replaces them with one fused kernel each way: RMSNorm (fp32
statistics, the same "llama" casting as HF), SiLU·mul (recomputing the SiLU in backward instead of saving it) and
RoPE. Its fused linear cross-entropy is not used: the actor's log-prob head is training/fused_logprob.py.

Applied to the HF model after loading and before LoRA and FSDP; the module keeps its class and parameters.
Liger patches the instance and also the architecture's module classes, so a model of the same architecture built
later in the process (the reference policy, which shares the key) computes the same way.
"""

from __future__ import annotations

import importlib.util

__all__ = ["LIGER_ARCHITECTURES", "liger_installed", "apply_liger"]

# HF model_type -> liger's apply function: the decoders the rollout engine runs (models/decoder.py)
KEY = "use_liger (actor_rollout_ref.model.use_liger; model.use_liger in SFT)"
LIGER_ARCHITECTURES = {"qwen2": "apply_liger_kernel_to_qwen2", "qwen3": "apply_liger_kernel_to_qwen3",
                       "llama": "apply_liger_kernel_to_llama", "mistral": "apply_liger_kernel_to_mistral"}


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def apply_liger(model) -> None:
    """Fused RMSNorm, SwiGLU and RoPE on `model` (an HF causal LM of a LIGER_ARCHITECTURES type), in place."""
    model_type = model.config.model_type
    if model_type not in LIGER_ARCHITECTURES:
        raise ValueError(f"{KEY}: no Liger kernels for model_type {model_type!r} "
                         f"(supported: {', '.join(LIGER_ARCHITECTURES)})")
    try:
        import liger_kernel.transformers as liger
    except ImportError as e:   # the plan saw the package on the driver; this worker cannot import it (or Triton)
        raise RuntimeError(f"{KEY}: liger-kernel does not import on this worker ({e}); "
                           "install it where the workers run, or set use_liger=false") from e
    getattr(liger, LIGER_ARCHITECTURES[model_type])(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                                    fused_linear_cross_entropy=False, model=model)
