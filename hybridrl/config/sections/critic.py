"""The `critic` section: the value model (built only with `algorithm.adv_estimator: gae`)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.optim import OptimConfig
from hybridrl.config.sections.values import Auto, LossAggMode, Strategy


@dataclass(frozen=True)
class CriticConfig(Section):
    """`critic`."""

    strategy: Strategy
    """training backend of the value model"""
    optim: OptimConfig
    model: CriticModelConfig
    ppo_mini_batch_size: int
    """prompts per critic mini-batch"""
    ppo_micro_batch_size: int | None
    """deprecated global form; use the _per_gpu key"""
    ppo_micro_batch_size_per_gpu: Auto | int | None
    """samples per critic forward/backward per GPU; auto = the run plan's choice"""
    forward_micro_batch_size_per_gpu: Auto | int | None
    """samples per values forward per GPU; auto = the run plan's choice"""
    forward_unshard_once: Auto | bool
    """all-gather FSDP shards once per values pass, not per micro-batch (true|false|auto)"""
    use_dynamic_bsz: Auto | bool
    """micro-batches by token count instead of rows (auto as the actor's, for ppo_micro_batch_size_per_gpu; values follow the update's choice)"""
    ppo_max_token_len_per_gpu: Auto | int
    """token budget with use_dynamic_bsz (update and values); auto = the run plan's choice"""
    ppo_epochs: int
    """passes over each batch"""
    shuffle: bool
    """shuffle between mini-batches"""
    ulysses_sequence_parallel_size: int
    """Ulysses SP degree of the critic; its dp = world / this"""
    grad_clip: float
    """max global grad norm"""
    cliprange_value: float
    """value clip epsilon"""
    loss_agg_mode: LossAggMode
    """how token losses are averaged"""


@dataclass(frozen=True)
class CriticModelConfig(Section):
    """`critic.model`."""

    path: str
    """value model initialisation (a value head is added)"""
    tokenizer_path: str
    """tokenizer of the critic: must be the actor's (data.tokenizer, else model.path; same path or identical tokenizer files), as the critic reads the actor's token ids"""
    override_config: dict
    """free dict merged into the HF model config"""
    enable_gradient_checkpointing: Auto | bool
    """recompute activations in backward (true|false|auto, as actor_rollout_ref.model's)"""
    enable_activation_offload: bool
    """as actor_rollout_ref.model.enable_activation_offload, for the critic's update"""
    use_remove_padding: Auto | bool
    """pack valid tokens and run varlen attention (needed for ulysses SP); auto = on where the critic's micro-batches are token-budgeted or split by Ulysses"""
    trust_remote_code: bool
    """passed to transformers' from_pretrained"""
    fsdp_config: CriticFSDPConfig


@dataclass(frozen=True)
class CriticFSDPConfig(Section):
    """`critic.model.fsdp_config`."""

    param_offload: bool
    """parameter shards on CPU except during compute_values and update_critic"""
    optimizer_offload: bool
    """optimizer state on CPU except during update_critic"""
    fsdp_size: int
    """-1 = shard over all ranks; smaller = HSDP"""
