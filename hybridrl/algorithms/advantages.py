"""Advantage estimators (verl's names, signatures and numbers) and the `compute_advantage` dispatcher.

Shape legend: B batch (one row per sample; the n samples of a prompt share a `uid`), R response length.
Every estimator takes right-padded [B, R] tensors plus `response_mask` [B, R] (1 on generated tokens,
eos included) and returns (advantages [B, R], returns [B, R]) in fp32, computed under no_grad.

Choices (each as verl does it, so a verl run's numbers carry over):
- gae: reversed loop over R; masked positions are skipped (value and running GAE carried across them),
  returns = advantages + values, then advantages are whitened over the mask. As in verl, the whitened
  advantages are not re-masked (padding gets -mean/std); every loss masks them.
- grpo: outcome score = row sum of token_level_rewards; (score - group mean) / (group std + eps) with the
  unbiased std, or score - mean with norm_adv_by_std_in_grpo=False (Dr.GRPO). A group of one sample gets
  mean 0 and std 1 (its advantage is its raw score), as verl. Vectorised with scatter-adds instead of
  verl's per-sample Python loop; the numbers are the same.
- rloo: score - mean of the *other* samples of the group (= n/(n-1) * (score - mean)); a singleton keeps
  its raw score (verl).
- reinforce_plus_plus: discounted return reset after each masked position, whitened over the mask.
- reinforce_plus_plus_baseline: score - group mean (singleton: mean 0), broadcast over the response,
  whitened over the whole batch's mask.
- remax: reverse cumulative sum of masked rewards minus the greedy baseline `reward_baselines` [B].
- grpo_vectorized: grpo with verl's groupwise statistics (std from the sums of scores and squares, floored at
  sqrt(epsilon)); equal to grpo except where a group's variance is below epsilon. It reads
  norm_adv_by_std_in_grpo from the config, where verl's ignores the config's value and always divides by the std.
- rloo_vectorized: rloo, except that a singleton gets 0 (verl's vectorised form multiplies by count > 1).
- grpo_passk (Pass@k, arXiv 2503.19595): only the best sample of each group gets a non-zero advantage, best minus
  second best (over the group's unbiased std + eps with norm_adv_by_std_in_grpo); every group needs 2 samples.
- opo (arXiv 2505.23585): score minus the group's length-weighted mean score (singleton: baseline 0).
- gpg (arXiv 2504.02546): alpha·(score - group mean) with alpha = B / (samples with a non-zero score) over the
  whole batch (singleton: mean 0); verl's f_norm = 1.
- Groups are keyed by `index` values (any hashable, e.g. uid strings); rows of a group need not be adjacent.
"""

from __future__ import annotations

from enum import Enum

import torch

from hybridrl.algorithms.registry import get_adv_estimator_fn, register_adv_est
from hybridrl.algorithms.utils import masked_whiten
from hybridrl.protocol import DataProto

__all__ = [
    "AdvantageEstimator",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_advantage",
    "compute_response_mask",
]


class AdvantageEstimator(str, Enum):
    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    GRPO_VECTORIZED = "grpo_vectorized"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_PASSK = "grpo_passk"
    OPO = "opo"
    GPG = "gpg"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"


GROUPED = ("rloo", "reinforce_plus_plus_baseline", "grpo_vectorized", "rloo_vectorized", "grpo_passk", "opo", "gpg",
           "optimal_token_baseline", "tir_optimal_token_baseline")
# the optimal token baseline's extra inputs: the old policy's log-probs and Σπ² (actor.calculate_sum_pi_squared)
OTB_INPUTS = ("old_log_probs", "sum_pi_squared")


def _check_shapes(name: str, mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    for key, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"{name}: {key} has shape {tuple(t.shape)}, response_mask has {tuple(mask.shape)}; "
                             "they must match ([B, R])")


def _group_stats(scores_b: torch.Tensor, index, name: str):
    """Per-row group size, group mean and unbiased group std (as tensors [B]), groups keyed by index."""
    gid_b = _group_ids(index, scores_b.shape[0], name, scores_b.device)
    count_g, sum_g = _group_sums(gid_b, torch.ones_like(scores_b), scores_b)
    mean_g = sum_g / count_g
    (sq_g,) = _group_sums(gid_b, (scores_b - mean_g[gid_b]) ** 2)
    std_g = torch.sqrt(sq_g / (count_g - 1).clamp(min=1))
    return count_g[gid_b], mean_g[gid_b], std_g[gid_b]


def _group_sums(gid_b: torch.Tensor, *values_b: torch.Tensor) -> list[torch.Tensor]:
    """Each [B] tensor of `values_b` summed per group ([G] each, G = groups in `gid_b`)."""
    groups = int(gid_b.max()) + 1 if len(gid_b) else 0
    return [torch.zeros(groups, dtype=v.dtype, device=v.device).index_add_(0, gid_b, v) for v in values_b]


def _group_ids(index, n: int, name: str, device) -> torch.Tensor:
    """Row -> group number (in order of first appearance), groups keyed by index values."""
    if len(index) != n:
        raise ValueError(f"{name}: index (uid) has {len(index)} entries but the batch has {n} rows")
    group_of: dict = {}
    return torch.tensor([group_of.setdefault(u, len(group_of)) for u in index], dtype=torch.long, device=device)


@register_adv_est(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(token_level_rewards: torch.Tensor, values: torch.Tensor,
                                 response_mask: torch.Tensor, gamma: float, lam: float):
    _check_shapes("compute_gae_advantage_return", response_mask, token_level_rewards=token_level_rewards,
                  values=values)
    rewards, values, mask = token_level_rewards.float(), values.float(), response_mask.float()
    next_values = torch.zeros_like(rewards[:, 0])
    last_gae = torch.zeros_like(rewards[:, 0])
    advantages_reversed = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        gae = delta + gamma * lam * last_gae
        next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
        last_gae = gae * mask[:, t] + (1 - mask[:, t]) * last_gae
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, config=None):
    _check_shapes("compute_grpo_outcome_advantage", response_mask, token_level_rewards=token_level_rewards)
    scores = token_level_rewards.float().sum(dim=-1)
    count, mean, std = _group_stats(scores, index, "compute_grpo_outcome_advantage")
    singleton = count == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    adv = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                   epsilon: float = 1e-6, config=None, **kwargs):
    _check_shapes("compute_rloo_outcome_advantage", response_mask, token_level_rewards=token_level_rewards)
    scores = token_level_rewards.float().sum(dim=-1)
    count, mean, _ = _group_stats(scores, index, "compute_rloo_outcome_advantage")
    scale = count / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, scores * scale - mean * scale, scores)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                                  config=None, gamma: float | None = None, **kwargs):
    """gamma is config.gamma (verl's way) or, without a config, the `gamma` keyword."""
    _check_shapes("compute_reinforce_plus_plus_outcome_advantage", response_mask,
                  token_level_rewards=token_level_rewards)
    if isinstance(config, int | float):
        raise TypeError(f"compute_reinforce_plus_plus_outcome_advantage: config={config!r} is a number; verl's "
                        "third argument is the algorithm config, pass the discount as gamma=")
    if config is not None:
        gamma = _cfg(config, "gamma", gamma)
    if gamma is None:
        raise ValueError("compute_reinforce_plus_plus_outcome_advantage: algorithm.gamma is needed; pass "
                         "config (with gamma) or gamma=")
    rewards, mask = token_level_rewards.float(), response_mask.float()
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]  # reset after eos
    return masked_whiten(returns, mask) * mask, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards: torch.Tensor,
                                                           response_mask: torch.Tensor, index,
                                                           epsilon: float = 1e-6, config=None, **kwargs):
    _check_shapes("compute_reinforce_plus_plus_baseline_outcome_advantage", response_mask,
                  token_level_rewards=token_level_rewards)
    scores = token_level_rewards.float().sum(dim=-1)
    count, mean, _ = _group_stats(scores, index, "compute_reinforce_plus_plus_baseline_outcome_advantage")
    scores = scores - torch.where(count == 1, torch.zeros_like(mean), mean)
    mask = response_mask.float()
    adv = scores.unsqueeze(-1) * mask
    adv = masked_whiten(adv, mask) * mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor,
                                    response_mask: torch.Tensor, config=None, **kwargs):
    _check_shapes("compute_remax_outcome_advantage", response_mask, token_level_rewards=token_level_rewards)
    if reward_baselines.shape != response_mask.shape[:1]:
        raise ValueError(f"compute_remax_outcome_advantage: reward_baselines has shape {tuple(reward_baselines.shape)}, "
                         f"expected [B] = ({response_mask.shape[0]},)")
    mask = response_mask.float()
    returns = (token_level_rewards.float() * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.float().unsqueeze(-1) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                              epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                              config=None, **kwargs):
    name = "compute_grpo_vectorized_outcome_advantage"
    _check_shapes(name, response_mask, token_level_rewards=token_level_rewards)
    scores = token_level_rewards.float().sum(dim=-1)
    if config is not None:
        norm_adv_by_std_in_grpo = _cfg(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    gid = _group_ids(index, scores.shape[0], name, scores.device)
    count, s1, s2 = _group_sums(gid, torch.ones_like(scores), scores, scores * scores)
    mean = s1 / count.clamp(min=1)
    var = (s2 - s1 * s1 / count.clamp(min=1)) / (count - 1).clamp(min=1)
    std = torch.sqrt(var.clamp(min=epsilon))
    single = count <= 1
    mean, std = torch.where(single, 0.0, mean), torch.where(single, 1.0, std)
    adv = (scores - mean[gid]) / (std[gid] + epsilon) if norm_adv_by_std_in_grpo else scores - mean[gid]
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                              epsilon: float = 1e-6, config=None, **kwargs):
    _check_shapes("compute_rloo_vectorized_outcome_advantage", response_mask, token_level_rewards=token_level_rewards)
    scores = token_level_rewards.float().sum(dim=-1)
    count, mean, _ = _group_stats(scores, index, "compute_rloo_vectorized_outcome_advantage")
    adv = torch.where(count > 1, count * (scores - mean) / (count - 1).clamp(min=1), 0.0)
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                         epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, config=None,
                                         **kwargs):
    name = "compute_grpo_passk_outcome_advantage"
    _check_shapes(name, response_mask, token_level_rewards=token_level_rewards)
    if config is not None:
        norm_adv_by_std_in_grpo = _cfg(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    scores = token_level_rewards.float().sum(dim=-1)
    gid = _group_ids(index, scores.shape[0], name, scores.device)
    adv = torch.zeros_like(scores)
    for g in torch.unique(gid).tolist():
        rows = torch.nonzero(gid == g).squeeze(-1)
        group = scores[rows]
        if group.numel() < 2:
            raise ValueError(f"{name}: Pass@k needs at least 2 samples per group; group {str(index[int(rows[0])])!r} "
                             f"has {group.numel()}")
        top, top_at = torch.topk(group, 2)
        best = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            best = best / (torch.std(group) + epsilon)
        adv[rows[top_at[0]]] = best
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                  epsilon: float = 1e-6, config=None, **kwargs):
    name = "compute_opo_outcome_advantage"
    _check_shapes(name, response_mask, token_level_rewards=token_level_rewards)
    scores = token_level_rewards.float().sum(dim=-1)
    lengths = response_mask.float().sum(dim=-1)
    gid = _group_ids(index, scores.shape[0], name, scores.device)
    count, weighted, total_len = _group_sums(gid, torch.ones_like(scores), lengths * scores, lengths)
    baseline = torch.where(count > 1, weighted / total_len, 0.0)
    adv = (scores - baseline[gid]).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                  epsilon: float = 1e-6, f_norm: float = 1.0, alpha: float = 1.0, config=None,
                                  **kwargs):
    """`alpha` is accepted for verl's signature; as in verl it is recomputed from the batch."""
    _check_shapes("compute_gpg_outcome_advantage", response_mask, token_level_rewards=token_level_rewards)
    scores = token_level_rewards.float().sum(dim=-1)
    count, mean, _ = _group_stats(scores, index, "compute_gpg_outcome_advantage")
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    adv = alpha * (scores - torch.where(count == 1, 0.0, mean)) / f_norm
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """response_mask from attention_mask's last R columns (R = responses' width), as verl derives it."""
    missing = [k for k in ("responses", "attention_mask") if k not in data.batch]
    if missing:
        raise ValueError(f"compute_response_mask: response_mask is absent and so are {missing}; "
                         "need response_mask, or responses + attention_mask to derive it")
    return data.batch["attention_mask"][:, -data.batch["responses"].shape[-1]:]


def _need(data: DataProto, key: str, estimator: str, non_tensor: bool = False):
    store = data.non_tensor_batch if non_tensor else data.batch
    if key not in store:
        where = "non_tensor_batch" if non_tensor else "batch"
        raise ValueError(f"compute_advantage: adv_estimator={estimator!r} needs {where} key {key!r}, "
                         f"which is missing (have {sorted(store)})")
    return store[key]


def _cfg(config, key: str, default=None):
    return config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)


def compute_advantage(data: DataProto, adv_estimator, gamma: float = 1.0, lam: float = 1.0, num_repeat: int = 1,
                      norm_adv_by_std_in_grpo: bool = True, config=None) -> DataProto:
    """Write `advantages` and `returns` into data.batch (in place; returns data), dispatching as verl does.

    Reads token_level_rewards, response_mask (derived from attention_mask if absent, as verl), values (gae),
    non-tensor uid (grpo, rloo, reinforce_plus_plus_baseline), reward_baselines (remax), old_log_probs and
    sum_pi_squared (and rollout_is_weights where present: the optimal token baselines). gae and grpo are called
    with gamma/lam/norm_adv_by_std_in_grpo; every other estimator is looked up in the registry (so one added
    with `register_adv_est` works) and called with token_level_rewards, response_mask, config, and index /
    reward_baselines when present. `config` is algorithm's config; without one the estimators get
    {gamma, lam, norm_adv_by_std_in_grpo}. num_repeat is accepted for verl's signature and unused (as in verl)."""
    name = adv_estimator.value if isinstance(adv_estimator, Enum) else adv_estimator
    estimator_fn = get_adv_estimator_fn(name)
    if "response_mask" not in data.batch:
        data.batch["response_mask"] = compute_response_mask(data)
    rewards = _need(data, "token_level_rewards", name)
    mask = data.batch["response_mask"]
    if name == "gae":
        adv, ret = estimator_fn(rewards, _need(data, "values", name), mask, gamma=gamma, lam=lam)
    elif name == "grpo":
        adv, ret = estimator_fn(rewards, mask, _need(data, "uid", name, non_tensor=True),
                                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    else:
        if name in GROUPED:
            _need(data, "uid", name, non_tensor=True)
        if name == "remax":
            _need(data, "reward_baselines", name)
        if config is None:
            config = {"gamma": gamma, "lam": lam, "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo}
        kwargs = {"token_level_rewards": rewards, "response_mask": mask, "config": config}
        if "uid" in data.non_tensor_batch:
            kwargs["index"] = data.non_tensor_batch["uid"]
        if "reward_baselines" in data.batch:
            kwargs["reward_baselines"] = data.batch["reward_baselines"]
        if name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
            kwargs.update({key: _need(data, key, name) for key in OTB_INPUTS})
            kwargs["rollout_is_weights"] = data.batch.get("rollout_is_weights")
        adv, ret = estimator_fn(**kwargs)
    data.batch["advantages"] = adv
    data.batch["returns"] = ret
    return data


PF_PPO_METHODS = ("pow", "max_min", "max_random")


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """PF-PPO's sampling weight of each sequence score (verl's compute_pf_ppo_reweight_data): pow |s| ** weight_pow,
    max_min 1 at the batch's highest and lowest score (else 0), max_random 0.4 at the highest (else 0.1); every
    weight floored at 1e-8, so a batch of zero weights draws uniformly."""
    if method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={method!r}: use one of {PF_PPO_METHODS}")
    return torch.clamp(weights + 1e-8, min=1e-8)


def pf_ppo_resample(data: DataProto, method: str, weight_pow: float, generator: torch.Generator
                    ) -> tuple[DataProto, dict[str, float]]:
    """The batch redrawn with replacement, as many rows as it has, row i with probability proportional to
    `pf_ppo_weights` of its summed token_level_scores (tensors, non-tensors and batch-long meta lists alike), and
    how many distinct samples the draw kept (pf_ppo/unique_samples) of how many (pf_ppo/samples)."""
    scores = data.batch["token_level_scores"].sum(dim=-1).float().cpu()
    idx = torch.multinomial(pf_ppo_weights(scores, method, weight_pow), len(scores), replacement=True,
                            generator=generator)
    out = data.select_idxs(idx)
    out.meta_info = {k: [v[i] for i in idx.tolist()] if isinstance(v, list) and len(v) == len(scores) else v
                     for k, v in data.meta_info.items()}
    return out, {"pf_ppo/unique_samples": float(idx.unique().numel()), "pf_ppo/samples": float(len(scores))}
