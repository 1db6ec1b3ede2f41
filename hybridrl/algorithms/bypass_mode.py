"""verl's bypass mode (`algorithm.rollout_correction.bypass_mode`): the rollout engine's log-probs are the old ones,
so no old-log-prob pass runs (two policies, π_rollout and π_θ, where the decoupled mode has three).

Per micro-batch of the update, from the update's own detached log-probs against the rollout's (shapes [B, R]):
- rejection (`rollout_rs`, `rollout_rs_threshold`) removes tokens / rows from the policy loss's mask;
- `loss_type=ppo_clip`: verl's vanilla PPO loss (clip-higher + dual-clip) with the ratio π_θ / π_rollout; no IS
  weights, since the clipped ratio already carries the mismatch;
- `loss_type=reinforce`: -w · A · log π_θ, with w the truncated IS weights of `rollout_is` / `rollout_is_threshold`
  (divided by their mean over the micro-batch with `rollout_is_batch_normalize`, as verl's bypass loss does), or
  w = 1 when `rollout_is` is null.
The normaliser: a rejected token adds nothing to the loss and still counts in its normaliser (the tokens, or rows,
before rejection), as in verl's engine workers (their global_batch_info), so the mini-batch's loss does not depend on
how it is cut into micro-batches; verl's legacy dp_actor instead divides each micro-batch by the tokens it kept.
Entropy and KL terms use the unrejected mask, as in verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from hybridrl.algorithms.policy_loss import agg_loss, vanilla_token_losses
from hybridrl.algorithms.policy_loss_modes import vanilla_clip
from hybridrl.algorithms.rollout_correction import (
    kept_by_rejection,
    parse_rs_thresholds,
    truncated_is_weights,
)
from hybridrl.algorithms.utils import masked_mean
from hybridrl.dotted import dotted_get

__all__ = ["LOSS_TYPES", "BypassLoss", "bypass_policy_loss"]

LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass(frozen=True)
class BypassLoss:
    """The bypass loss's settings, from `algorithm.rollout_correction` (the driver hands them to the actor)."""

    loss_type: str
    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"algorithm.rollout_correction.loss_type={self.loss_type!r}: must be one of "
                             f"{list(LOSS_TYPES)}")

    @classmethod
    def of(cls, section) -> BypassLoss:
        """From `algorithm.rollout_correction` (a section or a dict of its keys)."""
        return cls(**{k: dotted_get(section, k, getattr(cls, k, None)) for k in cls.__dataclass_fields__})

    @cached_property
    def thresholds(self) -> dict | None:
        """The rejection criteria, parsed once (parse_rs_thresholds); None without rejection."""
        return None if self.rollout_rs is None else parse_rs_thresholds(self.rollout_rs, self.rollout_rs_threshold)


def _weights(log_ratio, mask, s: BypassLoss) -> torch.Tensor | None:
    """The reinforce loss's truncated IS weights [B, R] (None: w = 1)."""
    if s.rollout_is is None:
        return None
    weights = truncated_is_weights(log_ratio, mask, s.rollout_is, float(s.rollout_is_threshold))
    if s.rollout_is_batch_normalize:   # verl's rule: a mean at or below 1e-8 leaves the weights as they are
        if s.rollout_is == "token":
            mean = masked_mean(weights, mask)
        else:
            rows = (mask.sum(-1) > 0).float()
            mean = (masked_mean(weights, mask, axis=-1) * rows).sum() / rows.sum().clamp_min(1e-8)
        weights = weights / torch.where(mean > 1e-8, mean, torch.ones_like(mean))
    return weights


def bypass_policy_loss(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
                       response_mask: torch.Tensor, loss_agg_mode: str, config, settings: BypassLoss
                       ) -> tuple[torch.Tensor, dict]:
    """(the micro-batch's policy loss, verl's `actor/` metrics as detached 0-d tensors). `config` is the actor
    section (clip ratios, loss_scale_factor)."""
    thresholds = settings.thresholds
    with torch.no_grad():
        log_ratio = torch.where(response_mask.bool(), log_prob.detach().float() - rollout_log_prob.float(), 0.0)
        kept = response_mask if thresholds is None else kept_by_rejection(log_ratio, response_mask, thresholds)
    rows = (response_mask.sum(-1) > 0).sum().float()
    normaliser = {"batch_num_tokens": response_mask.sum().float(), "global_batch_size": rows,
                  "loss_scale_factor": dotted_get(config, "loss_scale_factor", None)}
    if settings.loss_type == "ppo_clip":
        low, high, clip_ratio_c = vanilla_clip(config)
        losses, (clipfrac, ppo_kl, clipfrac_lower) = vanilla_token_losses(rollout_log_prob, log_prob, advantages,
                                                                          kept, low, high, clip_ratio_c)
        metrics = {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": clipfrac_lower}
    else:
        keep = kept.bool()
        losses = -torch.where(keep, log_prob.float(), 0.0) * torch.where(keep, advantages.float(), 0.0)
        weights = _weights(log_ratio, response_mask, settings)
        if weights is not None:
            losses = losses * weights
        metrics = {"actor/ppo_kl": masked_mean(-log_ratio, kept).detach()}
    return agg_loss(losses, kept, loss_agg_mode, **normaliser), metrics
