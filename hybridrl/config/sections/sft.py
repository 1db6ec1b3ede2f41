"""The SFT config (`sft_trainer.yaml`, verl's fsdp_sft_trainer keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.optim import MixedPrecisionConfig
from hybridrl.config.sections.values import Auto, Device, Dtype, LoggerName, Truncation, WarmupStyle


@dataclass(frozen=True)
class SFTConfig(Section):
    """The SFT config: the sections of `sft_trainer.yaml`."""

    data: SFTDataConfig
    model: SFTModelConfig
    optim: SFTOptimConfig
    trainer: SFTTrainerConfig
    ulysses_sequence_parallel_size: int
    """Ulysses sequence parallelism (verl's top-level SFT key): groups of this many ranks split every packed
    micro-batch's tokens (training/ulysses.py); needs model.use_remove_padding and query heads divisible by it"""


@dataclass(frozen=True)
class SFTTrainerConfig(Section):
    """`trainer`."""

    default_local_dir: str
    """output root: the final HF model is written to {default_local_dir}/huggingface, checkpoints to
    {default_local_dir}/global_step_N"""
    project_name: str
    """logger project"""
    experiment_name: str
    """logger run name"""
    total_epochs: int
    """passes over the training set"""
    total_training_steps: int | None
    """null = epochs x (rows // train_batch_size)"""
    logger: list[LoggerName] | LoggerName
    """console (a line of metrics every log_freq steps on rank 0), file, tensorboard, wandb, mlflow (as the RL run's,
    under {default_local_dir}/logs)"""
    log_freq: int
    """print metrics every N steps on rank 0"""
    seed: int
    """seed of the model init's RNG and of the per-epoch shuffle"""
    device: Device
    """auto | cuda | cpu"""
    save_dtype: Literal["float32", "bfloat16"]
    """dtype of the final HF model (float32 | bfloat16)"""
    save_freq: int
    """write a resumable checkpoint (trainer.checkpoint.contents) to {default_local_dir}/global_step_N every N steps
    and at the last step; -1 = none (the final HF model is written either way)"""
    test_freq: int
    """val/loss on data.val_files every N steps (and at the last step, as without it); -1 = at the last step only"""
    resume_mode: Literal["auto", "disable", "resume_path"]
    """auto = from the newest complete checkpoint under default_local_dir, if any | disable | resume_path =
    resume_from_path"""
    resume_from_path: str | None
    """a global_step_N directory (resume_mode=resume_path)"""
    max_ckpt_to_keep: int | None
    """checkpoints kept (the newest); null = all"""
    checkpoint: SFTCheckpointConfig


@dataclass(frozen=True)
class SFTCheckpointConfig(Section):
    """`trainer.checkpoint`."""

    contents: list[Literal["model", "optimizer", "extra", "hf_model"]]
    """what a checkpoint holds (verl's save_contents) and a resume loads: model (required), optimizer, extra (lr
    scheduler, RNG states), hf_model (also a from_pretrained copy in huggingface/)"""


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
    lora_rank: int
    """> 0: train LoRA adapters of this rank on a frozen base (verl's keys; the final HF model holds the merged
    weights); 0 = full fine-tuning"""
    lora_alpha: int | float
    """LoRA scale: the update is (lora_alpha / lora_rank) * B @ A"""
    target_modules: str | list[str]
    """all-linear, or a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"""
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
    """optional: val/loss at the end (and every trainer.test_freq steps)"""
    train_max_samples: int
    """the first N rows of the training files; -1 = all"""
    val_max_samples: int
    """the first N rows of the validation files; -1 = all"""
    prompt_key: str
    """chat list [{role, content}] (or a plain string = one user turn); dotted path reaches into a struct"""
    prompt_dict_keys: list[str] | None
    """verl's path into a struct column: the prompt is row[prompt_key][k1][k2]... (the same as a dotted prompt_key)"""
    response_key: str
    """response text column; dotted path reaches into a struct (extra_info.answer)"""
    response_dict_keys: list[str] | None
    """as prompt_dict_keys, for the response"""
    max_length: int
    """prompt + response + eos tokens"""
    truncation: Truncation
    """error | left (drop prompt head) | right (drop response tail); counted"""
    train_batch_size: int
    """sequences per optimizer step, all ranks together"""
    micro_batch_size_per_gpu: int
    """sequences per forward/backward per GPU (gradient accumulation up to train_batch_size / world)"""
    micro_batch_size: int | None
    """verl's deprecated global form: when set, micro_batch_size_per_gpu = micro_batch_size / world size"""
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
