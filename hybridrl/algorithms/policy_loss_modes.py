"""verl's registered policy losses (`actor.policy_loss.loss_mode`): vanilla, gspo, gpg, clip_cov, kl_cov, cispo,
sapo, geo_mean.

Each has verl's signature `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) -> (pg_loss, metrics)`, with `config` the actor config (a dict or a config section with
clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, policy_loss.{clip_cov_*, kl_cov_ratio, ppo_kl_coef},
tau_pos / tau_neg, and optionally global_batch_info for agg_loss), and metrics under verl's `actor/...` names:
computed ones as detached 0-d tensors (verl returns floats; the updater reads them once per update instead of
syncing per micro-batch; `float()` of each gives verl's value), constant ones as floats.
- vanilla: PPO clip-higher + dual-clip (policy_loss.compute_policy_loss).
- gspo (arXiv 2507.18071): one ratio per sequence, exp(mean over the sequence of log π/π_old), carried by each
  token as sg[s_i]·π/sg[π] (log clamped at 10), clipped like PPO; always aggregated seq-mean-token-mean.
- gpg: -A·log π (no ratio, no clipping).
- clip_cov (arXiv 2505.22617): the unclipped PPO loss, but a random `clip_cov_ratio` share of the tokens whose
  covariance (A - mean A)(log π - mean log π) lies in (clip_cov_lb, clip_cov_ub) lose their gradient.
- kl_cov (same paper): the top `kl_cov_ratio` share of tokens by that covariance get ppo_kl_coef·|log π/π_old|
  added to the unclipped loss.
- cispo (arXiv 2506.13585): -sg[clip(ratio, 1-ε_low, 1+ε_high)]·A·log π (gradient only through log π).
- sapo (arXiv 2511.20347): -A·(4/τ)·sigmoid(τ(ratio - 1)) per token, a smooth gate instead of a clip, τ = tau_pos
  where A > 0 else tau_neg; always aggregated seq-mean-token-mean.
- geo_mean (GMPO, arXiv 2507.20673): one ratio per sequence, the geometric mean of its token ratios, each clipped
  in log space to [-ε_low, ε_high] on the side the advantage's sign makes binding; times the sequence's mean
  advantage; a mean over the rows, as verl (an empty row adds 0 to it and counts).
`rollout_is_weights` [B, R], when given, multiplies the per-token losses. Entries outside the mask are zeroed
first (masked_log_ratio), so NaN/inf in padding reaches neither the loss nor the gradient.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.policy_loss import (
    _check_clip_range,
    agg_loss,
    masked_log_ratio,
    vanilla_token_losses,
)
from hybridrl.algorithms.registry import register_policy_loss
from hybridrl.algorithms.utils import masked_mean
from hybridrl.dotted import dotted_get

__all__ = ["compute_policy_loss_cispo", "compute_policy_loss_clip_cov", "compute_policy_loss_geo_mean",
           "compute_policy_loss_gpg", "compute_policy_loss_gspo", "compute_policy_loss_kl_cov",
           "compute_policy_loss_sapo", "compute_policy_loss_vanilla", "vanilla_clip"]


def _need_config(config, mode: str):
    if config is None:
        raise ValueError(f"policy loss {mode!r}: config (the actor config with clip_ratio ...) is required")


def _clip_range(config) -> tuple[float, float]:
    return _check_clip_range(dotted_get(config, "clip_ratio", None),
                             dotted_get(config, "clip_ratio_low", None),
                             dotted_get(config, "clip_ratio_high", None))


def _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights):
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    batch_info = {"loss_scale_factor": dotted_get(config, "loss_scale_factor", None),
                  **(dotted_get(config, "global_batch_info", None) or {})}
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info)


def _metrics(**metrics) -> dict:
    """verl's `actor/...` metric dict; tensors stay on their device, detached (the updater reads them once per
    update instead of syncing per micro-batch)."""
    return {f"actor/{k}": v.detach() if torch.is_tensor(v) else float(v) for k, v in metrics.items()}


def vanilla_clip(config) -> tuple[float, float, float]:
    """(clip_ratio_low, clip_ratio_high, clip_ratio_c) of the vanilla PPO loss from the actor config, checked."""
    clip_ratio_c = float(dotted_get(config, "clip_ratio_c", 3.0))
    low, high = _check_clip_range(dotted_get(config, "clip_ratio", None),
                                  dotted_get(config, "clip_ratio_low", None),
                                  dotted_get(config, "clip_ratio_high", None), clip_ratio_c)
    return low, high, clip_ratio_c


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    _need_config(config, "vanilla")
    low, high, clip_ratio_c = vanilla_clip(config)
    pg_losses, (clipfrac, ppo_kl, clipfrac_lower) = vanilla_token_losses(
        old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c)
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(pg_clipfrac=clipfrac, ppo_kl=ppo_kl, pg_clipfrac_lower=clipfrac_lower)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask,
                             loss_agg_mode="seq-mean-token-mean", config=None, rollout_is_weights=None):
    _need_config(config, "gspo")
    low, high = _clip_range(config)
    log_ratio, advantages = masked_log_ratio(old_log_prob, log_prob, advantages, response_mask)
    mask = response_mask.float()
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_prob = torch.where(response_mask.bool(), log_prob.float(), 0.0)
    log_seq_ratio = torch.clamp(log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1), max=10.0)
    seq_ratio = torch.exp(log_seq_ratio)
    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    # GSPO's objective is a mean over sequences: the mode is fixed whatever loss_agg_mode says (as verl)
    pg_loss = _aggregate(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    return pg_loss, _metrics(pg_clipfrac=clipfrac, ppo_kl=ppo_kl, pg_clipfrac_lower=0.0)


compute_policy_loss_gspo.loss_agg_mode = "seq-mean-token-mean"  # the aggregation it always uses: the actor scales
# its micro-batch losses by this mode's normaliser


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                            config=None, rollout_is_weights=None):
    keep = response_mask.bool()
    pg_losses = -torch.where(keep, log_prob.float(), 0.0) * torch.where(keep, advantages.float(), 0.0)
    return _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights), {}


def _token_covariance(advantages, log_prob, response_mask):
    """(A - masked mean A) * (log π - masked mean log π), the per-token covariance both *_cov losses rank by."""
    return ((advantages - masked_mean(advantages, response_mask))
            * (log_prob - masked_mean(log_prob.detach(), response_mask)))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    _need_config(config, "clip_cov")
    low, high = _clip_range(config)
    clip_cov_ratio = float(dotted_get(config, "policy_loss.clip_cov_ratio", 0.0002))
    lb = float(dotted_get(config, "policy_loss.clip_cov_lb", 1.0))
    ub = float(dotted_get(config, "policy_loss.clip_cov_ub", 5.0))
    if not clip_cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio={clip_cov_ratio} must be > 0")
    log_ratio, advantages = masked_log_ratio(old_log_prob, log_prob, advantages, response_mask)
    keep = response_mask.bool()
    log_prob = torch.where(keep, log_prob.float(), 0.0)
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped_by_ppo = (pg_losses2 > pg_losses1) & keep
    cov = _token_covariance(advantages, log_prob, response_mask).detach()
    candidates = (cov > lb) & (cov < ub) & keep & ~clipped_by_ppo
    picked = torch.nonzero(candidates)
    budget = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    picked = picked[torch.randperm(len(picked), device=picked.device)[:budget]]
    corr = torch.ones_like(advantages)
    corr[picked[:, 0], picked[:, 1]] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((corr == 0).float(), response_mask)
    return pg_loss, _metrics(pg_clipfrac=clipfrac, ppo_kl=masked_mean(-log_ratio, response_mask))


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                               config=None, rollout_is_weights=None):
    _need_config(config, "kl_cov")
    kl_cov_ratio = float(dotted_get(config, "policy_loss.kl_cov_ratio", 0.0002))
    section = dotted_get(config, "policy_loss", None)
    if section is None:
        ppo_kl_coef = 0.1   # verl's YAML default
    else:
        ppo_kl_coef = section.get("ppo_kl_coef", 0.1) if hasattr(section, "get") else getattr(section, "ppo_kl_coef", 0.1)
        ppo_kl_coef = 1.0 if ppo_kl_coef is None else float(ppo_kl_coef)   # verl's fallback for an explicit null
    if not kl_cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio={kl_cov_ratio} must be > 0")
    log_ratio, advantages = masked_log_ratio(old_log_prob, log_prob, advantages, response_mask)
    keep = response_mask.bool()
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    valid_idx = torch.nonzero(keep.reshape(-1), as_tuple=True)[0]
    if len(valid_idx) > 0:
        # covariance over the valid tokens only (means over them, not over the padded matrix)
        adv_v = advantages.detach().reshape(-1)[valid_idx]
        logp_v = log_prob.detach().float().reshape(-1)[valid_idx]
        cov_v = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
        top = valid_idx[torch.topk(cov_v, max(1, int(len(cov_v) * kl_cov_ratio))).indices]
        penalty = torch.zeros_like(pg_losses).reshape(-1)
        penalty[top] = 1.0
        pg_losses = pg_losses + ppo_kl_coef * log_ratio.abs() * penalty.reshape(pg_losses.shape)
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(ppo_kl=masked_mean(log_ratio.abs(), response_mask))


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                              config=None, rollout_is_weights=None):
    _need_config(config, "cispo")
    low, high = _clip_range(config)
    log_ratio, advantages = masked_log_ratio(old_log_prob, log_prob, advantages, response_mask)
    negative_approx_kl = torch.clamp(log_ratio, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    log_prob = torch.where(response_mask.bool(), log_prob.float(), 0.0)
    pg_losses = -clipped.detach() * advantages * log_prob
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((ratio != clipped).float(), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, _metrics(pg_clipfrac=clipfrac, ppo_kl=ppo_kl, pg_clipfrac_lower=0.0)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask,
                             loss_agg_mode="seq-mean-token-mean", config=None, rollout_is_weights=None):
    _need_config(config, "sapo")
    tau_pos = float(dotted_get(config, "tau_pos", 1.0))
    tau_neg = float(dotted_get(config, "tau_neg", 1.05))
    log_ratio, advantages = masked_log_ratio(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = torch.clamp(log_ratio, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gates * advantages
    # SAPO's objective is a mean over sequences: the mode is fixed whatever loss_agg_mode says (as verl)
    pg_loss = _aggregate(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return pg_loss, _metrics(pg_clipfrac=0.0, ppo_kl=masked_mean(-log_ratio, response_mask), pg_clipfrac_lower=0.0)


compute_policy_loss_sapo.loss_agg_mode = "seq-mean-token-mean"


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    _need_config(config, "geo_mean")
    low, high = _clip_range(config)
    log_ratio, advantages = masked_log_ratio(old_log_prob, log_prob, advantages, response_mask)
    mask = response_mask.float()
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -low, high)
    binding = sign * torch.minimum(sign * log_ratio, sign * clamped)
    tokens_b = mask.sum(-1)
    seq_ratio = torch.exp((binding * mask).sum(-1) / (tokens_b + 1e-8))
    seq_adv = (advantages * mask).sum(-1) / (tokens_b + 1e-8)
    pg_b = -seq_adv * seq_ratio
    if rollout_is_weights is not None:   # one weight a sequence: the geometric mean of its token weights
        log_w = torch.where(response_mask.bool(), torch.log(rollout_is_weights.float() + 1e-10), 0.0)
        pg_b = pg_b * torch.exp(log_w.sum(-1) / (tokens_b + 1e-8))
    # the mean over the micro-batch's rows, as verl (an empty row adds 0 and counts; global_batch_info is not read
    # there either); the updater scales micro-batches by their sequence counts (`loss_agg_mode` below)
    pg_loss = pg_b.mean()
    clipped = torch.ne(log_ratio, clamped)
    return pg_loss, _metrics(pg_clipfrac=masked_mean((clipped & (advantages > 0)).float(), response_mask),
                             ppo_kl=masked_mean(-log_ratio, response_mask),
                             pg_clipfrac_lower=masked_mean((clipped & (advantages < 0)).float(), response_mask))


compute_policy_loss_geo_mean.loss_agg_mode = "seq-mean-token-mean"
