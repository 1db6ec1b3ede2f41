"""The optimal token baseline (verl's `optimal_token_baseline` and `tir_optimal_token_baseline` estimators).

Shapes: B rows, R response positions; one prompt group per `index` value (the uid).

Per token, the score-norm proxy of the policy gradient is w_t = 1 - 2 π_t + Σπ² (π_t the old policy's probability of
the sampled token, Σπ² the sum of its squared probabilities over the vocabulary: actor.calculate_sum_pi_squared),
times the squared rollout IS weight where one is given. Its running sum W_t = Σ_{j<=t} w_j weighs each sample's
reward-to-go G_t in the group's per-position baseline B_t = Σ_i G_t W_t / (Σ_i W_t + ε), and A_t = G_t - B_t.
- A group of one sample keeps its reward-to-go (no baseline).
- `handle_zero_tail`: where one sample of a group is strictly the longest, its positions past the second longest get
  no baseline (no sibling informs them).
- The multi-turn form (tir_) counts positions by the response tokens only (tool output the mask leaves out does not
  advance t); its groups leave out samples without response tokens and it zeroes tails by default. The single-turn
  form counts absolute positions and does not zero tails unless asked, as in verl.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.algorithms.registry import register_adv_est

__all__ = ["OTB_ESTIMATORS", "compute_optimal_token_baseline_advantage",
           "compute_multi_turn_optimal_token_baseline_advantage", "score_norm_proxy"]

OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def score_norm_proxy(old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor,
                     rollout_is_weights: torch.Tensor | None = None) -> torch.Tensor:
    """w_t = 1 - 2 π_t + Σπ² per token [B, R] (times the squared IS weight where given)."""
    w = 1 - 2 * old_log_probs.float().exp() + sum_pi_squared.float()
    return w if rollout_is_weights is None else w * rollout_is_weights.float() ** 2


def _left_packed(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's values at its mask's positions moved to the front, in order (the rest after them)."""
    order = torch.argsort((mask <= 0).to(torch.int8), dim=-1, stable=True)
    return torch.gather(x, -1, order), order


def _otb(rewards, mask, index, old_log_probs, sum_pi_squared, rollout_is_weights, handle_zero_tail, epsilon,
         multi_turn: bool):
    mask = mask.float()
    returns = (rewards.float() * mask).flip(-1).cumsum(-1).flip(-1)
    w_cum = (score_norm_proxy(old_log_probs, sum_pi_squared, rollout_is_weights) * mask).cumsum(-1)
    lengths = mask.sum(-1)
    g, w, m = returns, w_cum, mask
    if multi_turn:   # positions are the response tokens' own: pack them to the front
        (g, order), w, m = _left_packed(returns, mask), _left_packed(w_cum, mask)[0], _left_packed(mask, mask)[0]
    inv = torch.as_tensor(np.unique(np.asarray(index), return_inverse=True)[1].reshape(-1), device=mask.device)
    member = (lengths > 0) if multi_turn else torch.ones_like(lengths, dtype=torch.bool)
    groups = int(inv.max()) + 1 if len(inv) else 0
    sizes = torch.zeros(groups, device=mask.device).index_add_(0, inv, member.float())
    num = torch.zeros(groups, g.shape[1], device=mask.device).index_add_(0, inv, g * w * m)
    den = torch.zeros_like(num).index_add_(0, inv, w * m)
    baseline = (num / (den + epsilon))[inv] * (sizes[inv] > 1).unsqueeze(-1)
    if handle_zero_tail:
        for k in range(groups):
            rows = torch.nonzero((inv == k) & member).flatten()
            if len(rows) < 2:
                continue
            group_lengths = lengths[rows]
            top2 = torch.sort(group_lengths).values[-2:]
            longest = rows[group_lengths == top2[1]]
            if len(longest) == 1 and top2[1] > top2[0]:
                baseline[longest[0], int(top2[0]):] = 0.0
    advantages = (g - baseline) * m
    if multi_turn:   # back to the rows' own positions
        advantages = torch.zeros_like(advantages).scatter_(-1, order, advantages)
    return advantages * mask, returns


@register_adv_est("optimal_token_baseline")
def compute_optimal_token_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                             index: np.ndarray, old_log_probs: torch.Tensor,
                                             sum_pi_squared: torch.Tensor,
                                             rollout_is_weights: torch.Tensor | None = None,
                                             handle_zero_tail: bool = False, epsilon: float = 1e-8, config=None):
    """(advantages, returns [B, R]): the single-turn optimal token baseline (module docstring)."""
    return _otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights,
                handle_zero_tail, epsilon, multi_turn=False)


@register_adv_est("tir_optimal_token_baseline")
def compute_multi_turn_optimal_token_baseline_advantage(token_level_rewards: torch.Tensor,
                                                        response_mask: torch.Tensor, index: np.ndarray,
                                                        old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor,
                                                        rollout_is_weights: torch.Tensor | None = None,
                                                        handle_zero_tail: bool = True, epsilon: float = 1e-8,
                                                        config=None):
    """(advantages, returns [B, R]): the multi-turn optimal token baseline (module docstring)."""
    return _otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights,
                handle_zero_tail, epsilon, multi_turn=True)
