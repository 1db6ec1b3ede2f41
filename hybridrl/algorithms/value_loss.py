"""PPO clipped value loss (verl / TRL): 0.5 * agg(max((v - R)^2, (clip(v, v_old ± eps) - R)^2)).

Shape legend: B batch, R response length; all inputs [B, R]. Inputs are upcast to fp32. vf_clipfrac is the
masked fraction of tokens where the clipped error was the larger one (returned detached: a metric).
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.policy_loss import agg_loss
from hybridrl.algorithms.utils import clip_by_value, masked_mean

__all__ = ["compute_value_loss"]


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float, loss_agg_mode: str = "token-mean"):
    """Returns (vf_loss, vf_clipfrac)."""
    if cliprange_value is None or cliprange_value < 0:
        raise ValueError(f"critic.cliprange_value={cliprange_value} must be a number >= 0")
    vpreds, returns, values = vpreds.float(), returns.float(), values.float()
    vpredclipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * agg_loss(clipped_vf_losses, response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac.detach()
