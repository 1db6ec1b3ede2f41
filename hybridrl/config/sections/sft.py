"""The SFT config (`sft_trainer.yaml`, verl's fsdp_sft_trainer keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.optim import MixedPrecisionConfig
from hybridrl.config.sections.values import Auto, Device, Dtype, Truncation, WarmupStyle


@dataclass(frozen=True)
class SFTConfig(Section):
    """The SFT config: the sections of `sft_trainer.yaml`."""

    data: SFTDataConfig
    model: SFTModelConfig
    optim: SFTOptimConfig
    trainer: SFTTrainerConfig


@dataclass(frozen=True)
class SFTTrainerConfig(Section):
    """`trainer`."""

    default_local_dir: str
    """output root: the final HF model is written to {default_local_dir}/huggingface"""
    project_name: str
    """logger project"""
    experiment_name: str
    """logger run name"""
    total_epochs: int
    """passes over the training set"""
    total_training_steps: int | None
    """null = epochs x (rows // train_batch_size)"""
    logger: list[str]
    """console (a line of metrics every log_freq steps on rank 0); the other RL loggers are not wired to SFT"""
    log_freq: int
    """print metrics every N steps on rank 0"""
    seed: int
    """seed of the model init's RNG and of the per-epoch shuffle"""
    device: Device
    """auto | cuda | cpu"""
    save_dtype: Literal["float32", "bfloat16"]
    """dtype of the final HF model (float32 | bfloat16)"""


@dataclass(frozen=True)
class SFTOptimConfig(Section):
    """`optim`."""

    lr: float
    """AdamW learning rate"""
    betas: list[float]
    """AdamW betas"""
    weight_decay: float
    """AdamW weight decay"""
    warmup_steps_ratio: float
    """warmup steps as a fraction of the total steps"""
    clip_grad: float
    """max global grad norm"""
    lr_scheduler: WarmupStyle
    """cosine | constant"""
    min_lr_ratio: float
    """cosine schedule floor as a fraction of lr"""


@dataclass(frozen=True)
class SFTModelConfig(Section):
    """`model`."""

    partial_pretrain: str
    """HF model directory (weights + tokenizer with a chat template); the default is the demo's tiny model"""
    trust_remote_code: bool
    """passed to transformers' from_pretrained"""
    custom_chat_template: str | None
    """a Jinja chat template (or its file) replacing the tokenizer's; saved with the model"""
    enable_gradient_checkpointing: bool
    """recompute activations in backward (one layer's activation memory instead of all)"""
    use_remove_padding: bool
    """packed varlen attention"""
    use_liger: Auto | bool
    """Liger's fused RMSNorm / SwiGLU / RoPE kernels, as actor_rollout_ref.model.use_liger (auto = on with CUDA,
    liger-kernel and a Qwen2/Qwen3/Llama/Mistral model)"""
    override_config: dict
    """free dict merged into the HF model config (add keys with +key=value)"""
    fsdp_config: SFTFSDPConfig


@dataclass(frozen=True)
class SFTFSDPConfig(Section):
    """`model.fsdp_config`."""

    model_dtype: Dtype
    """master weights"""
    fsdp_size: int
    """-1 = shard over all ranks; smaller = HSDP"""
    mixed_precision: MixedPrecisionConfig


@dataclass(frozen=True)
class SFTDataConfig(Section):
    """`data`."""

    train_files: str | list[str]
    """one path or a list; the default is the demo's data"""
    val_files: str | list[str] | None
    """optional: val/loss at the end"""
    prompt_key: str
    """chat list [{role, content}] (or a plain string = one user turn)"""
    response_key: str
    """response text column; dotted path reaches into a struct (extra_info.answer)"""
    max_length: int
    """prompt + response + eos tokens"""
    truncation: Truncation
    """error | left (drop prompt head) | right (drop response tail); counted"""
    train_batch_size: int
    """sequences per optimizer step, all ranks together"""
    micro_batch_size_per_gpu: int
    """sequences per forward/backward per GPU (gradient accumulation up to train_batch_size / world)"""
    shuffle: bool
    """shuffle the training rows every epoch (seeded by trainer.seed)"""
    multiturn: SFTMultiturnConfig


@dataclass(frozen=True)
class SFTMultiturnConfig(Section):
    """`data.multiturn`."""

    enable: bool
    """rows are conversations: loss on assistant turns only (prompt_key/response_key unused)"""
    messages_key: str
    """[{role, content, tool_calls?}] system/user/assistant/tool messages (verl's format)"""
    tools_key: str
    """optional column of tool schemas (a list, or a JSON string) for the template's tools="""
