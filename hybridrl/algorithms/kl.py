"""KL estimators between policy and reference log-probs, KL coefficient controllers, in-reward KL penalty.

Shape legend: B batch, R response length; log-probs [B, R].

Estimators (J. Schulman, "Approximating KL divergence"; x = logprob - ref_logprob, samples from the policy):
  "kl" / "k1": x            unbiased, high variance, can be negative per token
  "abs":       |x|
  "mse"/"k2":  0.5 * x^2    biased, low variance; its gradient is the gradient of KL
  "low_var_kl"/"k3": exp(-x) + x - 1, with -x clamped to [-20, 20] and the result to [-10, 10] (verl)
  name + "+" (e.g. "k3+", as newer verl): the value of the named estimator with k2's gradient
  (straight-through), since k1/k3 are unbiased for KL's value but not for its gradient.
  "full" needs whole-vocabulary distributions and raises NotImplementedError.
Inputs are upcast to fp32.

Controllers (verl): FixedKLController keeps kl_coef; AdaptiveKLController (Ziegler et al. 2019,
arXiv 1909.08593) multiplies the coefficient by 1 + clip(kl/target - 1, -0.2, 0.2) * n_steps / horizon.

apply_kl_penalty (verl's ray_trainer function): token_level_rewards = token_level_scores - beta * kl * mask,
then updates the controller with the batch KL (mean over sequences of the per-sequence masked mean) and
n_steps = batch size, and reports actor/reward_kl_penalty and actor/reward_kl_penalty_coeff (beta used).
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.algorithms.utils import masked_mean
from hybridrl.protocol import DataProto

__all__ = ["KL_PENALTY_NAMES", "kl_penalty", "FixedKLController", "AdaptiveKLController", "get_kl_controller",
           "apply_kl_penalty"]

KL_PENALTY_NAMES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _kl_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, name: str) -> torch.Tensor:
    if name in ("kl", "k1"):
        return logprob - ref_logprob
    if name == "abs":
        return (logprob - ref_logprob).abs()
    if name in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if name in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    if name == "full":
        raise NotImplementedError("kl_penalty='full' needs the full-vocabulary distributions of both policies, "
                                  "which the per-token log-prob interface does not carry; use one of "
                                  f"{list(KL_PENALTY_NAMES)}")
    raise ValueError(f"kl_penalty={name!r} is not supported; valid: {list(KL_PENALTY_NAMES)} "
                     "(optionally with a '+' suffix for the k2 straight-through gradient)")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate [B, R] in fp32 (see the module docstring for the names)."""
    logprob, ref_logprob = logprob.float(), ref_logprob.float()
    if not isinstance(kl_penalty, str):
        raise ValueError(f"kl_penalty must be a string, one of {list(KL_PENALTY_NAMES)}; got {kl_penalty!r}")
    if not kl_penalty.endswith("+"):
        return _kl_forward(logprob, ref_logprob, kl_penalty)
    value = _kl_forward(logprob, ref_logprob, kl_penalty[:-1])
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


_kl_estimate = kl_penalty  # apply_kl_penalty's argument of the same name (verl's signature) shadows it


class FixedKLController:
    """Constant KL coefficient; update() is a no-op."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """value *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if not horizon > 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={horizon} must be > 0 for the adaptive controller")
        if not target_kl > 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl={target_kl} must be > 0 for the adaptive controller")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = np.clip(current_kl / self.target - 1, -0.2, 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def _cfg(cfg, key: str, default=None):
    if hasattr(cfg, "get"):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def get_kl_controller(kl_ctrl):
    """Build the controller from algorithm.kl_ctrl (a dict or a config section with type, kl_coef,
    target_kl, horizon)."""
    kind = _cfg(kl_ctrl, "type", "fixed")
    kl_coef = _cfg(kl_ctrl, "kl_coef")
    if kl_coef is None:
        raise ValueError("algorithm.kl_ctrl.kl_coef is missing or null; it must be a number")
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=_cfg(kl_ctrl, "target_kl"),
                                    horizon=_cfg(kl_ctrl, "horizon"))
    raise ValueError(f"algorithm.kl_ctrl.type={kind!r} is not supported; valid: ['fixed', 'adaptive']")


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl", policy_key: str = "old_log_probs"):
    """Set data.batch['token_level_rewards'] from token_level_scores minus the KL penalty between the policy's
    log-probs (`policy_key`: the old ones, or the rollout's in bypass mode) and the reference's; returns
    (data, metrics)."""
    needed = ("token_level_scores", policy_key, "ref_log_prob", "response_mask")
    missing = [k for k in needed if k not in data.batch]
    if missing:
        raise ValueError(f"apply_kl_penalty (algorithm.use_kl_in_reward=True) needs batch keys {list(needed)}; "
                         f"missing {missing} (ref_log_prob comes from the reference policy)")
    response_mask = data.batch["response_mask"]
    kld = _kl_estimate(data.batch[policy_key], data.batch["ref_log_prob"], kl_penalty)
    kld = torch.where(response_mask.bool(), kld, 0.0) * response_mask  # a NaN in padding must not leak in
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"].float() - beta * kld
    current_kl = torch.mean(masked_mean(kld, response_mask, axis=-1), dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
