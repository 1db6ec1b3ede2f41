"""PPO clipped policy loss (clip-higher + dual-clip), loss aggregation and entropy loss (verl's semantics).

Shape legend: B batch, R response length, V vocabulary. Loss inputs are [B, R] with response_mask [B, R].

Choices:
- compute_policy_loss is verl's vanilla PPO loss: ratio = exp(clamp(logp - old_logp, -20, 20));
  per token max(-A*ratio, -A*clip(ratio, 1-eps_low, 1+eps_high)) (clip-higher: DAPO's asymmetric range);
  for A < 0 the loss is further capped at -A*clip_ratio_c (dual-clip, arXiv 1912.09729), so a huge ratio
  on a negative advantage cannot blow the loss up. Metrics: pg_clipfrac (tokens where the clipped term
  was taken), ppo_kl (masked mean of old_logp - logp), pg_clipfrac_lower (tokens the dual-clip capped).
  The metrics are returned detached (they are logged, never differentiated); pg_loss keeps the graph.
- Inputs are upcast to fp32 (bf16 log-probs would make the ratio wrong in the third digit).
- agg_loss modes (verl): token-mean = sum(loss*mask)/sum(mask) over the whole micro-batch;
  seq-mean-token-sum = mean over sequences of the per-sequence token sum; seq-mean-token-mean = mean over
  sequences of the per-sequence token mean; seq-mean-token-sum-norm = sum of per-sequence token sums / R
  (Dr.GRPO's constant normaliser). Sequences whose mask is all zero are left out of the two seq-mean
  modes' denominators (newer verl does the same; the older code produced NaN for them).
- Bad names and out-of-range clip values raise ValueError naming the key (actor.*), the value and the rule.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.utils import entropy_from_logits, masked_mean, masked_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss", "compute_policy_loss", "compute_entropy_loss"]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, dp_size: int = 1,
             batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None) -> torch.Tensor:
    """Aggregate a [B, R] loss matrix into a scalar (see the module docstring for each mode).

    verl's global-batch arguments: with `batch_num_tokens` (token-mean) or `global_batch_size` (seq-mean modes)
    the sum is divided by that global count instead of the local one; either way the result is multiplied by
    `dp_size` (verl's convention: the data-parallel gradient average divides it out again);
    `loss_scale_factor` replaces R as seq-mean-token-sum-norm's constant. Entries outside the mask are zeroed
    before anything is summed, so NaN/inf in padding never reaches the loss."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"actor.loss_agg_mode={loss_agg_mode!r} is not supported; valid: {list(LOSS_AGG_MODES)}")
    loss_mat = loss_mat.float() if loss_mat.dtype in (torch.bfloat16, torch.float16) else loss_mat
    loss_mask = loss_mask.float() if loss_mask.dtype in (torch.bfloat16, torch.float16) else loss_mask
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            return masked_mean(loss_mat, loss_mask) * dp_size
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    seq_sum_b = masked_sum(loss_mat, loss_mask, axis=-1)
    tokens_b = torch.sum(loss_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return torch.sum(seq_sum_b) / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    nonempty_b = (tokens_b > 0).float()
    per_seq_b = seq_sum_b if loss_agg_mode == "seq-mean-token-sum" else seq_sum_b / (tokens_b + 1e-8)
    if global_batch_size is None:
        return masked_mean(per_seq_b, nonempty_b) * dp_size
    return masked_sum(per_seq_b, nonempty_b) / global_batch_size * dp_size


def _check_clip_range(cliprange, cliprange_low, cliprange_high, clip_ratio_c=None) -> tuple[float, float]:
    cliprange_low = cliprange if cliprange_low is None else cliprange_low
    cliprange_high = cliprange if cliprange_high is None else cliprange_high
    if cliprange_low is None or cliprange_high is None:
        raise ValueError("compute_policy_loss: actor.clip_ratio is null and so is clip_ratio_low/clip_ratio_high; "
                         f"got cliprange={cliprange}, cliprange_low={cliprange_low}, cliprange_high={cliprange_high}")
    if not (0 <= cliprange_low <= 1) or cliprange_high < 0:
        raise ValueError(f"compute_policy_loss: need 0 <= clip_ratio_low <= 1 (1: no lower clip) and clip_ratio_high >= 0, "
                         f"got clip_ratio_low={cliprange_low}, clip_ratio_high={cliprange_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"actor.clip_ratio_c={clip_ratio_c} must be > 1.0 (dual-clip lower bound of the ratio)")
    return cliprange_low, cliprange_high


def masked_log_ratio(old_log_prob, log_prob, advantages, response_mask):
    """(log_prob - old_log_prob, advantages) in fp32 with 0 outside the mask: a NaN/inf in padding then reaches
    neither the loss nor, through exp(), the gradient."""
    keep = response_mask.bool()
    log_ratio = torch.where(keep, log_prob.float() - old_log_prob.float(), 0.0)
    return log_ratio, torch.where(keep, advantages.float(), 0.0)


def vanilla_token_losses(old_log_prob, log_prob, advantages, response_mask, cliprange_low: float,
                         cliprange_high: float, clip_ratio_c: float):
    """PPO clip-higher + dual-clip per-token losses [B, R] and (pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
    log_ratio, advantages = masked_log_ratio(old_log_prob, log_prob, advantages, response_mask)
    negative_approx_kl = torch.clamp(log_ratio, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3).float() * (advantages < 0).float(),
                                    response_mask)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return pg_losses, (pg_clipfrac.detach(), ppo_kl.detach(), pg_clipfrac_lower.detach())


def compute_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, cliprange: float | None = None,
                        cliprange_low: float | None = None, cliprange_high: float | None = None,
                        clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean"):
    """Returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower); cliprange_low/high default to cliprange."""
    cliprange_low, cliprange_high = _check_clip_range(cliprange, cliprange_low, cliprange_high, clip_ratio_c)
    pg_losses, stats = vanilla_token_losses(old_log_prob, log_prob, advantages, response_mask, cliprange_low,
                                            cliprange_high, clip_ratio_c)
    return (agg_loss(pg_losses, response_mask, loss_agg_mode), *stats)


def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor,
                         loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """Aggregated token entropy of logits [B, R, V] (fp32, chunked; differentiable)."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
