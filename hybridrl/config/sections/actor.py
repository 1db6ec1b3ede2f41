"""`actor_rollout_ref.actor` and `actor_rollout_ref.ref`: the policy's update and the reference policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.optim import MixedPrecisionConfig, OptimConfig
from hybridrl.config.sections.rules import Findings, check_fsdp_size, check_token_len, check_update_batches
from hybridrl.config.sections.values import (
    Auto,
    CheckpointContent,
    Dtype,
    KLLossType,
    LossAggMode,
    PolicyLossMode,
    Strategy,
)

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"


@dataclass(frozen=True)
class LogProbPassConfig(Section):
    """The batch keys of a log-prob pass, first in the two sections that run one: `actor_rollout_ref.ref` (the
    reference's) and `actor_rollout_ref.rollout` (the old log-probs')."""

    log_prob_micro_batch_size: int | None
    """deprecated global form; use the _per_gpu key"""
    log_prob_micro_batch_size_per_gpu: Auto | int | None
    """samples per log-prob forward per GPU (each result goes to the host at once); auto = the run plan's choice"""
    log_prob_use_dynamic_bsz: Auto | bool
    """micro-batches by token count instead of rows; auto as actor.use_dynamic_bsz, for
    log_prob_micro_batch_size_per_gpu"""
    log_prob_max_token_len_per_gpu: Auto | int
    """token budget per GPU with log_prob_use_dynamic_bsz (with Ulysses a micro-batch holds it x the SP size, as in
    verl); auto = the run plan's choice"""
    log_prob_unshard_once: Auto | bool
    """all-gather FSDP shards once per pass, not per micro-batch (true|false|auto: if the bf16 model <= 25% of GPU
    memory)"""

    def check_log_prob_batches(self, prefix: str, cfg, found: Findings) -> None:
        """A log-prob pass needs a token budget that holds one sequence, or a micro-batch size without one."""
        if self.log_prob_use_dynamic_bsz is True:   # auto: the plan checks it where it turns them on
            check_token_len(f"{prefix}.log_prob_max_token_len_per_gpu", self.log_prob_max_token_len_per_gpu, cfg,
                            found, cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
        elif self.log_prob_micro_batch_size_per_gpu is None and self.log_prob_micro_batch_size is None:
            found.errors.append(f"'{prefix}.log_prob_micro_batch_size_per_gpu' is null: set it (or "
                                "log_prob_use_dynamic_bsz)")


# the log-prob passes' batch keys (the reference's and the rollout's old-log-prob pass)
LOG_PROB_SIZES = ("log_prob_max_token_len_per_gpu", "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size")


@dataclass(frozen=True)
class RefConfig(LogProbPassConfig):
    """`actor_rollout_ref.ref`."""

    fsdp_config: RefFSDPConfig

    def check_sizes(self, found: Findings) -> None:
        found.positive_or_unset(self, REF, LOG_PROB_SIZES)

    def check(self, cfg, found: Findings) -> None:
        self.check_log_prob_batches(REF, cfg, found)


@dataclass(frozen=True)
class RefFSDPConfig(Section):
    """`actor_rollout_ref.ref.fsdp_config`."""

    param_offload: bool
    """keep the reference model on CPU between uses"""


@dataclass(frozen=True)
class ActorConfig(Section):
    """`actor_rollout_ref.actor`."""

    strategy: Strategy
    """training backend (FSDP2, torch's fully_shard)"""
    ppo_mini_batch_size: int
    """prompts per mini-batch (multiplied by rollout.n inside)"""
    ppo_micro_batch_size: int | None
    """deprecated global form; use the _per_gpu key"""
    ppo_micro_batch_size_per_gpu: Auto | int | None
    """samples per forward/backward per GPU (gradient accumulation inside a mini-batch); auto = the run plan's choice
    (docs/architecture.md)"""
    use_dynamic_bsz: Auto | bool
    """micro-batches by token count (ppo_max_token_len_per_gpu) instead of rows: each holds as many of the step's
    sequences as its token budget takes, at their actual lengths. auto = on on GPUs where ppo_micro_batch_size_per_gpu
    is auto or null (an explicit micro-batch size keeps verl's fixed rows), off on CPU"""
    ppo_max_token_len_per_gpu: Auto | int
    """token budget of a micro-batch with use_dynamic_bsz; auto = the run plan's choice: 16384 tokens, raised on GPUs
    for models under ~6B to the work of 32k tokens of a 1.5B (at most 65536) so the GPU's work hides the host's kernel
    launches; at least the longest sequence (over the Ulysses SP size: a group's micro-batch holds this x the SP
    size, 1/SP of it on each GPU, as in verl); lowered to fit memory"""
    grad_clip: float
    """max global grad norm"""
    clip_ratio: float
    """PPO ratio clip epsilon"""
    clip_ratio_low: float | None
    """null = clip_ratio. verl's default is 0.2 (not null), so there clip_ratio alone does not move the bounds;
    here it moves both unless this is set"""
    clip_ratio_high: float | None
    """null = clip_ratio (verl's default: 0.2; see clip_ratio_low)"""
    clip_ratio_c: float
    """dual-clip lower bound for negative advantages"""
    loss_agg_mode: LossAggMode
    """token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm"""
    loss_scale_factor: int | None
    """seq-mean-token-sum-norm's constant divisor (Dr.GRPO) for the policy, entropy and KL losses; null = the
    responses' padded width (data.max_response_length)"""
    policy_loss: PolicyLossConfig
    tau_pos: float
    """policy_loss.loss_mode=sapo: the gate's temperature on tokens with a positive advantage"""
    tau_neg: float
    """policy_loss.loss_mode=sapo: the gate's temperature on tokens with a zero or negative advantage (above tau_pos:
    negative updates fade faster)"""
    entropy_coeff: float
    """entropy bonus weight in the policy loss"""
    calculate_sum_pi_squared: bool
    """the old-log-prob pass also returns Σπ² per token (the sum of the squared token probabilities): the optimal
    token baseline's input, and the step's variance_proxy/* metrics; turns the old-log-prob pass on"""
    use_kl_loss: bool
    """KL to the reference policy as a loss term (GRPO style)"""
    kl_loss_coef: float
    """weight of the KL loss"""
    kl_loss_type: KLLossType
    """k1 | k2 | mse | k3 | low_var_kl | abs, or any of them with "+" (e.g. k3+): its value with k2's gradient (unbiased)"""
    router_aux_loss_coef: float
    """MoE models: weight of the router's load-balancing loss (transformers' load_balancing_loss_func, the key named as
    in HF configs; the model config's own value is not used), logged as actor/router_aux_loss; 0 = off"""
    router_z_loss_coef: float
    """MoE models: weight of the router z-loss (mean over tokens and MoE layers of logsumexp(router logits)^2), logged
    as actor/router_z_loss; 0 = off"""
    router_replay: RouterReplayConfig
    ppo_epochs: int
    """passes over each rollout batch"""
    update_unshard_once: Auto | bool
    """keep every FSDP block all-gathered for a whole mini-batch of the update (one all-gather per block per
    mini-batch instead of two per micro-batch) for the memory of the model in the compute dtype. auto = the run plan's
    choice: on where the bf16 model <= 25% of GPU memory and the update fits 90% of the GPU with it, or it costs at
    most one layer that checkpointing would let keep its activations; off on CPU | true | false"""
    old_log_prob_pass: Auto | bool
    """auto = skipped when the update is one on-policy mini-batch (1 epoch, mini-batch = batch, no KL in reward): old
    log-probs are then the update's own, detached (ratio exactly 1), and with algorithm.rollout_correction.bypass_mode
    (the rollout's are the old ones) | true | false"""
    early_update: Auto | bool
    """start the update on the prompt groups whose samples have all finished while the others still generate: their
    forward and backward run beside the decode tail, at the weights that sampled them, and the one optimizer step
    comes after the last group (the same update, its gradient put on the whole batch's normaliser). false (the
    default: on the long-tail 1.5B on one H200, handing each group to the update as it finished, the rollout slowed
    by as much as the update hid, 17.94 s a step against 17.91, for a 78.5 GiB peak against 48.9; waiting for the
    rollout's tail, 18.00 s against 17.65) | auto = on on a GPU where the
    update is exact that way and fits beside the rollout within 75% of the GPU (one on-policy mini-batch, advantages
    from each group's own rewards, one training rank; docs/architecture.md); off on CPU | true (refused where it is
    not exact; the update's recompute is then planned to fit beside the rollout)"""
    shuffle: bool
    """shuffle samples between mini-batches (seeded by trainer.seed and the step)"""
    use_prefix_grouper: Auto | bool
    """the actor's, reference's and critic's forwards run each prompt once for all its samples in a micro-batch (packed:
    the prompt, then each response, which sees the prompt and itself only): the same log-probs and gradients in P + n*R
    tokens instead of n*(P + R). auto = on on GPUs when rollout.n > 1 and no Ulysses SP (off on CPU; the critic's only
    without its own Ulysses SP); true packs the forwards whatever use_remove_padding says"""
    ulysses_sequence_parallel_size: int
    """Ulysses SP degree; training dp = world / this"""
    optim: OptimConfig
    fsdp_config: ActorFSDPConfig
    checkpoint: CheckpointConfig

    def check_sizes(self, found: Findings) -> None:
        found.positive(self, ACTOR, ("ppo_mini_batch_size", "ppo_epochs", "ulysses_sequence_parallel_size", "optim.lr"))
        found.positive_or_unset(self, ACTOR, ("ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu",
                                              "ppo_micro_batch_size", "loss_scale_factor"))
        if self.policy_loss.loss_mode == "sapo":
            found.positive(self, ACTOR, ("tau_pos", "tau_neg"))

    def check(self, cfg, found: Findings) -> None:
        """Rules of the actor's keys (`cfg`: the whole PPOConfig, for the batch arithmetic)."""
        rollout = cfg.actor_rollout_ref.rollout
        for key in ("router_aux_loss_coef", "router_z_loss_coef"):
            if getattr(self, key) < 0:
                found.errors.append(f"'{ACTOR}.{key}' must be >= 0 (0 = off), got {getattr(self, key)}")
        if self.router_replay.mode == "R3" and rollout.name != "native":
            found.errors.append(f"'{ACTOR}.router_replay.mode' = R3 needs 'actor_rollout_ref.rollout.name' = native "
                                f"(the engine that records each token's experts), got {rollout.name!r}")
        check_fsdp_size(f"{ACTOR}.fsdp_config.fsdp_size", self.fsdp_config.fsdp_size, cfg, found)
        check_update_batches(ACTOR, "actor_rollout_ref.model", self, cfg.actor_rollout_ref.model.use_remove_padding,
                             cfg, found)
        if self.use_kl_loss and cfg.algorithm.use_kl_in_reward:
            found.warnings.append(f"'{ACTOR}.use_kl_loss' and 'algorithm.use_kl_in_reward' are both true: "
                                  "the KL penalty is applied twice (verl allows it; usually one is meant)")
        if self.calculate_sum_pi_squared and self.old_log_prob_pass is False:
            found.errors.append(f"'{ACTOR}.calculate_sum_pi_squared' = true needs the old-log-prob pass that returns "
                                f"it, but '{ACTOR}.old_log_prob_pass' = false")
        if self.calculate_sum_pi_squared and cfg.algorithm.rollout_correction.bypass_mode:
            found.errors.append(f"'{ACTOR}.calculate_sum_pi_squared' = true needs the old-log-prob pass that returns "
                                "it, which 'algorithm.rollout_correction.bypass_mode' = true skips")
        contents = list(self.checkpoint.contents)
        if "model" not in contents and "hf_model" not in contents:
            found.errors.append(f"'{ACTOR}.checkpoint.contents' = {contents} must include 'model' (the sharded "
                                "weights a run resumes from) or 'hf_model' (an export of the weights alone)")
        elif "model" not in contents:
            found.warnings.append(f"'{ACTOR}.checkpoint.contents' = {contents} has 'hf_model' but not 'model': each "
                                  "checkpoint is an export of the weights that no run can resume from (a resume "
                                  "from one stops, naming it); add 'model' to resume")
        self.policy_loss.check(found)


@dataclass(frozen=True)
class CheckpointConfig(Section):
    """`actor_rollout_ref.actor.checkpoint`."""

    contents: list[CheckpointContent]
    """what the actor checkpoint saves and a resume loads: model (the sharded weights), optimizer, extra (lr
    scheduler, RNG states), hf_model (a from_pretrained copy); a resume without optimizer starts a fresh AdamW; without
    model (hf_model only: verl's export-only checkpoints) no run can resume from the checkpoint"""


@dataclass(frozen=True)
class ActorFSDPConfig(Section):
    """`actor_rollout_ref.actor.fsdp_config`."""

    param_offload: bool
    """hybrid engine: FSDP shards on CPU during generation (after resharding), back for log-prob/update"""
    optimizer_offload: Auto | bool
    """hybrid engine: optimizer state in pinned host memory from the rollout until the update's first optimizer step
    (copied out and back each step, ~50 GB/s on an H200 host; the buffers stay pinned for the run). With one optimizer
    step per update the forward and backward run without it, which the run plan counts (less recompute). auto = the run plan's choice: on only
    on a GPU with the hybrid engine and full fine-tuning (not LoRA) where, with the state on the GPU, the rollout's
    KV cache would hold fewer than all of the step's sequences at full length (or the rollout would not fit), with
    it on the CPU more of them fit, and the node's host memory can pin the state of all its GPUs (75% of what is
    available when the run is planned); off elsewhere and on CPU. True where the host cannot pin it is refused"""
    fsdp_size: int
    """-1 = shard over all ranks; smaller = HSDP ('ddp','fsdp')"""
    model_dtype: Dtype
    """master weights"""
    mixed_precision: MixedPrecisionConfig


@dataclass(frozen=True)
class RouterReplayConfig(Section):
    """`actor_rollout_ref.actor.router_replay`."""

    mode: Literal["disabled", "R3"]
    """MoE models (verl's key): disabled | R3 = the native rollout engine records each token's experts per MoE layer
    (routed_experts) and the actor's old-log-prob pass and update route those tokens to them, gates from the training
    router (actor/routing_mismatch_frac: how often its own top-k differed); the reference routes on its own"""


@dataclass(frozen=True)
class PolicyLossConfig(Section):
    """`actor_rollout_ref.actor.policy_loss`."""

    loss_mode: PolicyLossMode
    """policy loss from verl's registry: vanilla (PPO clip-higher + dual-clip) | gspo (sequence ratio, always
    seq-mean-token-mean) | gpg | clip_cov | kl_cov | cispo | sapo (smooth gate, actor.tau_pos / tau_neg; always
    seq-mean-token-mean) | geo_mean (GMPO: geometric mean of the clipped token ratios per sequence), or a name
    registered with register_policy_loss by model.external_lib"""
    clip_cov_ratio: float
    """clip_cov: share of tokens whose gradient is cut"""
    clip_cov_lb: float
    """clip_cov: lower bound of the covariance a cut token has"""
    clip_cov_ub: float
    """clip_cov: upper bound of the covariance a cut token has"""
    kl_cov_ratio: float
    """kl_cov: share of tokens (highest covariance) that get the KL penalty"""
    ppo_kl_coef: float
    """kl_cov: weight of that penalty"""

    def check(self, found: Findings) -> None:
        key = f"{ACTOR}.policy_loss"
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            if not 0 < getattr(self, name) <= 1:
                found.errors.append(f"'{key}.{name}' = {getattr(self, name)} must be in (0, 1]")
        if not self.clip_cov_lb < self.clip_cov_ub:
            found.errors.append(f"'{key}.clip_cov_lb' = {self.clip_cov_lb} must be < '{key}.clip_cov_ub' = "
                                f"{self.clip_cov_ub}")
