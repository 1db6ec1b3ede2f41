"""`actor_rollout_ref.model`: the policy's HF model (shared by the actor, the reference and the rollout engine)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.rules import Findings
from hybridrl.config.sections.values import Auto


@dataclass(frozen=True)
class ModelConfig(Section):
    """`actor_rollout_ref.model`."""

    path: str
    """HF model directory (config.json + safetensors + tokenizer); the default is the demo's SFT model, which `hybridrl
    train` with no arguments writes"""
    external_lib: str | None
    """a module imported in the driver and every worker before any model is built (registers custom HF model classes);
    an import failure stops the run naming this key"""
    override_config: dict
    """free dict merged into the HF model config (add keys with +key=value)"""
    enable_gradient_checkpointing: Auto | bool
    """recompute activations in backward: activation memory of one layer instead of all (~30% more update compute). auto
    = the run plan's choice, time first within the device: off where the update without it fits 90% of the GPU at the
    micro-batch chosen with it (beside the rollout with actor.early_update=true); else on, except for as many of the
    last decoder layers as keep their activations within that; off on CPU. true = every layer (the lean choice)"""
    enable_activation_offload: Auto | bool
    """with gradient checkpointing: each layer's saved input goes to host memory in the update's forward and comes back
    in backward (GPU keeps one layer's activations; costs a host round trip of tokens x hidden x 2 bytes per layer).
    auto = the run plan's choice: on (with checkpointing) only on a GPU where the update cannot fit one sequence of
    the longest length (prompt + response) within 90% of the GPU with checkpointing alone but can with it; off
    elsewhere, on CPU and with enable_gradient_checkpointing=false. true needs checkpointing true or auto"""
    use_remove_padding: Auto | bool
    """pack valid tokens and run varlen attention (needed for ulysses SP); auto = on where the actor's micro-batches are
    token-budgeted (use_dynamic_bsz) or split by Ulysses, else padded"""
    use_liger: Auto | bool
    """Liger's fused Triton kernels (RMSNorm, SwiGLU, RoPE) in the actor's and reference's training forward and backward
    (package liger-kernel, CUDA; Qwen2/2.5, Qwen3, Llama, Mistral). auto = on where all of that holds, else off (the
    plan says which and why)"""
    trust_remote_code: bool
    """passed to transformers' from_pretrained"""
    custom_chat_template: str | None
    """a Jinja chat template (or the path of a file with one) replacing the tokenizer's, for prompts and multi-turn tool
    messages (e.g. a model whose template cannot render tool calls)"""
    lora_rank: int
    """LoRA rank of the actor's adapters (peft); 0 = full fine-tuning. > 0: only the adapters train and have optimizer
    state, the reference is the base with adapters off, the rollout engine gets merged weights"""
    lora_alpha: int | float
    """LoRA scale: the update is (lora_alpha / lora_rank) * B @ A"""
    target_modules: str | list[str]
    """linears that get adapters: all-linear or a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    down_proj (may be [] when target_parameters names experts)"""
    target_parameters: list[str] | None
    """mixture-of-experts expert tensors that get adapters (with lora_rank > 0): null (none) or a list of
    experts.gate_up_proj, experts.down_proj. peft's own LoraConfig key: transformers 5 holds a layer's experts as fused
    3-D tensors, not linears, so target_modules cannot name them; peft adapts each with per-expert A and B
    (ParamWrapper). Refused for a model without MoE layers. Targeted experts reach the rollout engine merged (W_e +
    scale * B_e @ A_e), so they are copied, never used in place from the actor"""

    exclude_modules: str | list[str] | None
    """modules among the targets that get no adapter, as peft reads its own key (verl passes it on): a string is a
    regular expression a module's full name must match (e.g. '.*layers\\.0\\..*'), a list names modules by their
    full name or its last parts; null = none excluded"""
    lora_adapter_path: str | None
    """a peft LoRA adapter directory (adapter_config.json + adapter_model.safetensors: `hybridrl merge` of a LoRA
    checkpoint or peft's save_pretrained writes one) that the actor's adapters start from, as verl loads it: the
    adapter's r, lora_alpha, target_modules, target_parameters and exclude_modules become the keys above (left at their
    defaults they take them; a lora_rank > 0 other than its r is an error). The reference is the base without it"""

    def check(self, found: Findings) -> None:
        from hybridrl.models.tokenizer import resolve_chat_template
        from hybridrl.training.lora import check_lora_keys

        try:
            resolve_chat_template(self.custom_chat_template)
        except ValueError as e:
            found.errors.append(str(e))
        check_activation_offload(self, "actor_rollout_ref.model", found)
        found.errors += check_lora_keys(self.lora_rank, self.lora_alpha, self.target_modules, self.target_parameters)


def check_activation_offload(model, prefix: str, found: Findings) -> None:
    """Activation offload moves what gradient checkpointing keeps, so true needs checkpointing on (or auto); auto
    never turns it on without checkpointing."""
    if model.enable_activation_offload is True and model.enable_gradient_checkpointing is False:
        found.errors.append(f"'{prefix}.enable_activation_offload' = true needs '{prefix}."
                            "enable_gradient_checkpointing' = true or auto (it offloads the inputs checkpointing "
                            "keeps)")
