"""The `critic` section: the value model (built only with `algorithm.adv_estimator: gae`)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.model import check_activation_offload
from hybridrl.config.sections.optim import OptimConfig
from hybridrl.config.sections.rules import Findings, check_fsdp_size, check_token_len, check_update_batches
from hybridrl.config.sections.values import Auto, LossAggMode, Strategy
from hybridrl.config.tokenizer_files import same_tokenizer


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
    """micro-batches by token count instead of rows (auto as the actor's, for ppo_micro_batch_size_per_gpu; values
    follow the update's choice)"""
    ppo_max_token_len_per_gpu: Auto | int
    """token budget per GPU of an update micro-batch with use_dynamic_bsz (x critic.ulysses_sequence_parallel_size per
    micro-batch, as in verl); auto = the run plan's choice"""
    forward_max_token_len_per_gpu: Auto | int
    """token budget of a values micro-batch with use_dynamic_bsz (a forward without gradients, so it may be larger);
    auto = ppo_max_token_len_per_gpu where that is set (verl's default), else the run plan's choice"""
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

    def check_sizes(self, cfg, found: Findings) -> None:
        found.positive(self, "critic", ("ulysses_sequence_parallel_size",))
        if cfg.algorithm.adv_estimator == "gae":  # the critic exists only then
            found.positive(self, "critic", ("ppo_mini_batch_size", "ppo_epochs", "optim.lr"))
            found.positive_or_unset(self, "critic", ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu",
                                                     "ppo_micro_batch_size_per_gpu",
                                                     "forward_micro_batch_size_per_gpu", "ppo_micro_batch_size"))

    def check(self, cfg, found: Findings) -> None:
        """Rules of the critic's keys, checked only with gae (the critic exists only then), but activation offload."""
        check_activation_offload(self.model, "critic.model", found)
        if cfg.algorithm.adv_estimator != "gae":
            return
        from hybridrl.training.lora import check_lora_keys

        found.errors += check_lora_keys(self.model.lora_rank, self.model.lora_alpha, self.model.target_modules,
                                        prefix="critic.model")
        check_fsdp_size("critic.model.fsdp_config.fsdp_size", self.model.fsdp_config.fsdp_size, cfg, found)
        check_update_batches("critic", "critic.model", self, self.model.use_remove_padding, cfg, found)
        if self.use_dynamic_bsz is True:   # auto: the plan checks it where it turns them on
            check_token_len("critic.forward_max_token_len_per_gpu", self.forward_max_token_len_per_gpu, cfg, found,
                            self.ulysses_sequence_parallel_size)
        actor_tok = cfg.data.tokenizer or cfg.actor_rollout_ref.model.path
        critic_tok = self.model.tokenizer_path
        if not same_tokenizer(critic_tok, actor_tok):
            found.errors.append(f"'critic.model.tokenizer_path' = {critic_tok!r} is not the actor's tokenizer "
                                f"{actor_tok!r} (data.tokenizer, else actor_rollout_ref.model.path): the critic scores "
                                "the actor's token ids, so it must use the same tokenizer (same path or identical "
                                "files)")


@dataclass(frozen=True)
class CriticModelConfig(Section):
    """`critic.model`."""

    path: str
    """value model initialisation (a value head is added)"""
    tokenizer_path: str
    """tokenizer of the critic: must be the actor's (data.tokenizer, else model.path; same path or identical tokenizer
    files), as the critic reads the actor's token ids"""
    override_config: dict
    """free dict merged into the HF model config"""
    enable_gradient_checkpointing: Auto | bool
    """recompute activations in backward (true|false|auto, as actor_rollout_ref.model's)"""
    enable_activation_offload: bool
    """as actor_rollout_ref.model.enable_activation_offload, for the critic's update"""
    use_remove_padding: Auto | bool
    """pack valid tokens and run varlen attention (needed for ulysses SP); auto = on where the critic's micro-batches
    are token-budgeted or split by Ulysses"""
    trust_remote_code: bool
    """passed to transformers' from_pretrained"""
    lora_rank: int
    """> 0: the critic trains LoRA adapters of this rank on its frozen backbone, and its value head whole (verl's
    critic LoRA: peft's token-classification task); 0 = full fine-tuning"""
    lora_alpha: int | float
    """LoRA scale: the update is (lora_alpha / lora_rank) * B @ A"""
    target_modules: str | list[str]
    """all-linear, or a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"""
    fsdp_config: CriticFSDPConfig


@dataclass(frozen=True)
class CriticFSDPConfig(Section):
    """`critic.model.fsdp_config`."""

    param_offload: bool
    """parameter shards on CPU except during compute_values and update_critic"""
    optimizer_offload: bool
    """optimizer state on CPU except from update_critic's first optimizer step (after its backward) to its end;
    with one optimizer step per update the forward and backward run without it, which the run plan counts"""
    fsdp_size: int
    """-1 = shard over all ranks; smaller = HSDP"""
