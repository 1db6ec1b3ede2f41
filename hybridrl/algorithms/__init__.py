"""RL algorithm functions on padded [B, R] tensors with a response mask, with verl's names and signatures.

Modules: utils (masked statistics, chunked fp32 log-prob / entropy / Σπ²), advantages (estimators and the
compute_advantage dispatcher), optimal_token_baseline (verl's OTB estimators), policy_loss (agg_loss, PPO
clip-higher + dual-clip loss, entropy loss), policy_loss_modes (verl's registered losses: vanilla, gspo, gpg, clip_cov, kl_cov, cispo, sapo, geo_mean), registry
(register_adv_est / get_adv_estimator_fn, register_policy_loss / get_policy_loss_fn), value_loss (clipped
value loss), kl (KL estimators, controllers, in-reward penalty). core_algos re-exports
all of them under verl's module name (verl.trainer.ppo.core_algos). rollout_correction (truncated IS weights,
rejection sampling and off-policy metrics of the rollout-vs-trainer mismatch) is imported from its module.
"""

from hybridrl.algorithms.advantages import (
    AdvantageEstimator,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_response_mask,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from hybridrl.algorithms.kl import (
    KL_PENALTY_NAMES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from hybridrl.algorithms.optimal_token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from hybridrl.algorithms.policy_loss import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
)
from hybridrl.algorithms.policy_loss_modes import (
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from hybridrl.algorithms.registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)
from hybridrl.algorithms.utils import (
    clip_by_value,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    sum_pi_squared_from_logits,
)
from hybridrl.algorithms.value_loss import compute_value_loss

__all__ = [
    "AdvantageEstimator",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_response_mask",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "KL_PENALTY_NAMES",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "get_kl_controller",
    "kl_penalty",
    "LOSS_AGG_MODES",
    "agg_loss",
    "compute_entropy_loss",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "register_adv_est",
    "register_policy_loss",
    "clip_by_value",
    "entropy_from_logits",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "sum_pi_squared_from_logits",
    "compute_value_loss",
]
