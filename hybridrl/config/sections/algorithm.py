"""The `algorithm` section: advantages, the in-reward KL, DAPO's dynamic sampling, rollout correction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.rules import Findings
from hybridrl.config.sections.values import AdvEstimator, FilterMetric, KLType

# estimators whose baseline is the rest of the prompt's group (a group of one keeps its raw score)
GROUP_BASELINED = ("grpo", "grpo_vectorized", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline",
                   "optimal_token_baseline", "tir_optimal_token_baseline")
OTB = ("optimal_token_baseline", "tir_optimal_token_baseline")


@dataclass(frozen=True)
class AlgorithmConfig(Section):
    """`algorithm`."""

    gamma: float
    """discount factor (gae)"""
    lam: float
    """GAE lambda"""
    adv_estimator: AdvEstimator
    """gae | grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | remax | grpo_vectorized |
    rloo_vectorized | grpo_passk (best sample over the second best; n >= 2) | opo (length-weighted baseline) | gpg |
    optimal_token_baseline, tir_optimal_token_baseline (a per-token group baseline weighed by the score norm; need
    actor.calculate_sum_pi_squared), or a name registered with register_adv_est by model.external_lib (verl's default: gae)"""
    norm_adv_by_std_in_grpo: bool
    """false = Dr.GRPO"""
    use_kl_in_reward: bool
    """subtract a KL penalty from the token rewards (PPO style)"""
    kl_penalty: KLType
    """k1/kl | abs | mse/k2 | low_var_kl/k3, for the in-reward penalty"""
    kl_ctrl: KLControlConfig
    filter_groups: FilterGroupsConfig
    rollout_correction: RolloutCorrectionConfig
    use_pf_ppo: bool
    """PF-PPO (verl's policy filtration): after GAE, the step's samples are redrawn with replacement, each with
    probability proportional to a weight of its sequence score (algorithm.pf_ppo), so the update trains a batch of the
    same size that repeats well- or badly-scored samples; gae only, as in verl"""
    pf_ppo: PfPpoConfig

    def check(self, cfg, found: Findings) -> None:
        """Dynamic sampling and rollout correction (DAPO / verl's recipe keys); group estimators need groups
        (rollout.n, the samples per prompt). `cfg`: the whole PPOConfig."""
        n = cfg.actor_rollout_ref.rollout.n
        self.filter_groups.check(n, found)
        self.rollout_correction.check(cfg.actor_rollout_ref.actor, found)
        if self.adv_estimator in OTB and not cfg.actor_rollout_ref.actor.calculate_sum_pi_squared:
            found.errors.append(f"'algorithm.adv_estimator' = {self.adv_estimator} needs "
                                "'actor_rollout_ref.actor.calculate_sum_pi_squared' = true (its baseline weighs "
                                "each token by 1 - 2π + Σπ², which the old-log-prob pass returns)")
        if self.adv_estimator in OTB and self.rollout_correction.bypass_mode:
            found.errors.append(f"'algorithm.adv_estimator' = {self.adv_estimator} needs the old-log-prob pass "
                                "(its old log-probs and Σπ²), which 'algorithm.rollout_correction.bypass_mode' = true "
                                "skips")
        if self.use_pf_ppo and self.adv_estimator != "gae":
            found.warnings.append(f"'algorithm.use_pf_ppo' is true with 'algorithm.adv_estimator' = "
                                  f"{self.adv_estimator}: PF-PPO resamples after GAE only (as in verl), so nothing is "
                                  "resampled")
        if self.use_pf_ppo and self.pf_ppo.reweight_method == "pow" and not self.pf_ppo.weight_pow > 0:
            found.errors.append(f"'algorithm.pf_ppo.weight_pow' = {self.pf_ppo.weight_pow} must be > 0 (the weight is "
                                "|score| ** weight_pow)")
        if self.adv_estimator in GROUP_BASELINED and n == 1:
            found.warnings.append(f"'algorithm.adv_estimator' = {self.adv_estimator} with "
                                  "'actor_rollout_ref.rollout.n' = 1: every group has one sample, so there is no group "
                                  "baseline and each advantage is the sample's raw score (set rollout.n > 1)")
        if self.adv_estimator == "rloo_vectorized" and n == 1:
            found.warnings.append("'algorithm.adv_estimator' = rloo_vectorized with 'actor_rollout_ref.rollout.n' = 1: "
                                  "a group of one sample has no leave-one-out baseline and gets advantage 0, so "
                                  "nothing trains (set rollout.n > 1)")
        if self.adv_estimator == "grpo_passk" and n < 2:
            found.errors.append(f"'algorithm.adv_estimator' = grpo_passk needs 'actor_rollout_ref.rollout.n' >= 2 (it "
                                f"credits the best sample over the second best of each group), got {n}")


@dataclass(frozen=True)
class RolloutCorrectionConfig(Section):
    """`algorithm.rollout_correction`."""

    rollout_is: Literal["token", "sequence"] | None
    """truncated importance sampling of the rollout-vs-trainer mismatch: null (off) | token | sequence"""
    rollout_is_threshold: float
    """upper truncation of the IS weights"""
    rollout_is_batch_normalize: bool
    """divide the IS weights by their batch mean (needs the old-log-prob pass)"""
    rollout_rs: str | None
    """rejection sampling criteria, comma-separated: token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3
    (needs the old-log-prob pass); null = off"""
    rollout_rs_threshold: str | float | None
    """one threshold for all criteria or one per criterion, comma-separated; k1 takes 'lower_upper' ratio bounds or an
    upper (lower = 1/upper)"""
    bypass_mode: bool
    """the rollout's log-probs are the old ones: no old-log-prob pass; rejection and the IS weights are made per
    update micro-batch from the update's own log-probs (verl's bypass mode; algorithms/bypass_mode.py)"""
    loss_type: Literal["ppo_clip", "reinforce"]
    """bypass_mode's policy loss: ppo_clip = the vanilla PPO loss with ratio π/π_rollout (no IS weights); reinforce =
    -w·A·log π with w the truncated IS weights of rollout_is (1 when null)"""

    def check(self, actor, found: Findings) -> None:
        """`actor`: the actor section (its policy loss and old-log-prob pass meet the bypass mode)."""
        rc = "algorithm.rollout_correction"
        if self.bypass_mode:
            if actor.policy_loss.loss_mode != "vanilla":
                found.errors.append(f"'{rc}.bypass_mode' = true replaces the policy loss with its '{rc}.loss_type' "
                                    f"({self.loss_type}), but 'actor_rollout_ref.actor.policy_loss.loss_mode' = "
                                    f"{actor.policy_loss.loss_mode}: set loss_mode to vanilla or bypass_mode to false")
            if actor.old_log_prob_pass is True:
                found.errors.append(f"'{rc}.bypass_mode' = true takes the rollout's log-probs as the old ones, but "
                                    "'actor_rollout_ref.actor.old_log_prob_pass' = true would compute log-probs that "
                                    "nothing reads: set it to auto")
            if self.loss_type == "ppo_clip" and self.rollout_is is not None:
                found.warnings.append(f"'{rc}.rollout_is' = {self.rollout_is} with bypass_mode and loss_type "
                                      "ppo_clip: the clipped ratio π/π_rollout carries the mismatch, no IS weights are "
                                      "applied (as in verl); its metrics are still logged")
        elif self.loss_type != "ppo_clip":
            found.errors.append(f"'{rc}.loss_type' = {self.loss_type} acts only with '{rc}.bypass_mode' = true: set "
                                "bypass_mode or leave loss_type at ppo_clip")
        if self.rollout_is is not None and not self.rollout_is_threshold > 0:
            found.errors.append(f"'{rc}.rollout_is_threshold' = {self.rollout_is_threshold} must be > 0")
        if self.rollout_is_batch_normalize and self.rollout_is is None:
            found.warnings.append(f"'{rc}.rollout_is_batch_normalize' is true but '{rc}.rollout_is' is null: no "
                                  "weights")
        if self.rollout_rs is not None:
            from hybridrl.algorithms.rollout_correction import parse_rs_thresholds

            try:
                parse_rs_thresholds(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as e:
                found.errors.append(str(e))
        elif self.rollout_rs_threshold is not None:
            found.warnings.append(f"'{rc}.rollout_rs_threshold' is set but '{rc}.rollout_rs' is null: nothing is "
                                  "rejected")


@dataclass(frozen=True)
class FilterGroupsConfig(Section):
    """`algorithm.filter_groups`."""

    enable: bool
    """DAPO's dynamic sampling: drop prompt groups whose metric is equal over their n samples and generate further
    batches (data.gen_batch_size prompts) until train_batch_size prompts remain"""
    metric: FilterMetric | None
    """acc | score | seq_reward | seq_final_reward; required with enable"""
    max_num_gen_batches: int
    """stop the run when this many generation batches did not give enough prompts; 0 = no limit"""

    def check(self, n: int, found: Findings) -> None:
        fg = "algorithm.filter_groups"
        if self.enable and self.metric is None:
            found.errors.append(f"'{fg}.metric' is null but '{fg}.enable' is true: set acc, score, seq_reward or "
                                "seq_final_reward")
        if self.max_num_gen_batches < 0:
            found.errors.append(f"'{fg}.max_num_gen_batches' = {self.max_num_gen_batches} must be >= 0 (0 = no limit)")
        if self.enable and n == 1:
            found.warnings.append(f"'{fg}.enable' with rollout.n = 1: a one-sample group is always kept, nothing is "
                                  "filtered")


@dataclass(frozen=True)
class PfPpoConfig(Section):
    """`algorithm.pf_ppo`."""

    reweight_method: Literal["pow", "max_min", "max_random"]
    """a sample's weight from its sequence score s: pow = |s| ** weight_pow; max_min = 1 for the batch's highest
    and lowest score, else 0; max_random = 0.4 for the highest, else 0.1 (verl's methods)"""
    weight_pow: float
    """the exponent of pow"""


@dataclass(frozen=True)
class KLControlConfig(Section):
    """`algorithm.kl_ctrl`."""

    type: Literal["fixed", "adaptive"]
    """fixed | adaptive"""
    kl_coef: float
    """(initial) in-reward KL coefficient"""
    horizon: int
    """adaptive controller horizon"""
    target_kl: float
    """adaptive controller target KL"""
