"""DataParallelPPOCritic: values and the clipped value-loss update on an FSDP2-sharded value model.

The value model is HF's `AutoModelForTokenClassification(num_labels=1)` (backbone + linear score head).
Values [B, R] are the head outputs at the positions *before* each response token (the state the token is
chosen in), as in verl, multiplied by response_mask. Micro-batching, accumulation weights, grad clipping and
the non-finite-norm skip follow the actor (see actor.py); metrics: `critic/vf_loss`, `critic/vf_clipfrac`,
`critic/vpred_mean`, `critic/grad_norm`, `critic/lr`, `critic/grad_norm_nonfinite_skips`.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from hybridrl.algorithms import compute_value_loss, masked_mean
from hybridrl.protocol import DataProto
from hybridrl.training.actor import _mean, clip_grad_norm
from hybridrl.training.micro_batches import iter_mini_batches, loss_scale, make_micro_batches, normaliser
from hybridrl.training.packing import forward_response_logits, restore_order

__all__ = ["DataParallelPPOCritic"]


class DataParallelPPOCritic:
    def __init__(self, config, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler=None, use_remove_padding: bool | None = None):
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.scheduler = scheduler
        model_cfg = config.get("model") or {}
        self.use_remove_padding = bool(model_cfg.get("use_remove_padding", False) if use_remove_padding is None
                                       else use_remove_padding)
        self.device = next(module.parameters()).device
        self.nonfinite_skips = 0

    def _forward_micro_batch(self, micro: DataProto) -> torch.Tensor:
        b = micro.batch
        response_length = b["responses"].shape[1]
        out = forward_response_logits(self.module, b["input_ids"].to(self.device),
                                      b["attention_mask"].to(self.device), b["position_ids"].to(self.device),
                                      response_length, self.use_remove_padding, keep_only_needed=False)
        return out[..., 0].float() * b["response_mask"].to(self.device)

    def compute_values(self, data: DataProto) -> torch.Tensor:
        """values [B, R] on CPU; micro-batches from meta_info (micro_batch_size / use_dynamic_bsz, max_token_len)."""
        meta = data.meta_info
        self.module.eval()
        data = data.select(["responses", "input_ids", "attention_mask", "position_ids", "response_mask"])
        micros, bins = make_micro_batches(
            data, bool(meta.get("use_dynamic_bsz", False)),
            meta.get("micro_batch_size", self.config.get("forward_micro_batch_size_per_gpu")),
            meta.get("max_token_len", self.config.get("ppo_max_token_len_per_gpu")),
            size_key="critic.forward_micro_batch_size_per_gpu", token_key="critic.ppo_max_token_len_per_gpu")
        with torch.no_grad():
            values = [self._forward_micro_batch(m).cpu() for m in micros]
        return restore_order(values, bins) if bins is not None else torch.cat(values)

    def update_critic(self, data: DataProto) -> dict[str, float]:
        cfg = self.config
        if self.optimizer is None:
            raise ValueError("update_critic needs an optimizer")
        data = data.select(["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "values",
                            "returns"])
        mode = cfg.get("loss_agg_mode", "token-mean")
        metrics: dict[str, list[float]] = defaultdict(list)
        lr = self.optimizer.param_groups[0]["lr"]
        skips_before = self.nonfinite_skips
        self.module.train()
        for mini in iter_mini_batches(data, cfg, "critic"):
            self._update_mini_batch(mini, mode, metrics)
        if self.scheduler is not None:
            self.scheduler.step()
        out = {f"critic/{k}": v for k, v in _mean(metrics).items()}
        out["critic/lr"] = lr
        out["critic/grad_norm_nonfinite_skips"] = float(self.nonfinite_skips - skips_before)
        return out

    def _update_mini_batch(self, mini: DataProto, mode: str, metrics):
        cfg = self.config
        micros, _ = make_micro_batches(mini, bool(cfg.get("use_dynamic_bsz", False)),
                                       cfg.get("ppo_micro_batch_size_per_gpu"), cfg.get("ppo_max_token_len_per_gpu"),
                                       size_key="critic.ppo_micro_batch_size_per_gpu",
                                       token_key="critic.ppo_max_token_len_per_gpu")
        mini_norm = normaliser(mini.batch["response_mask"], mode)
        self.optimizer.zero_grad(set_to_none=True)
        for micro in micros:
            mask = micro.batch["response_mask"].to(self.device)
            vpreds = self._forward_micro_batch(micro)
            vf_loss, vf_clipfrac = compute_value_loss(vpreds, micro.batch["returns"].to(self.device),
                                                      micro.batch["values"].to(self.device), mask,
                                                      cliprange_value=float(cfg.get("cliprange_value", 0.5)),
                                                      loss_agg_mode=mode)
            (vf_loss * loss_scale(mask, mini_norm, mode)).backward()
            metrics["vf_loss"].append(vf_loss.item())
            metrics["vf_clipfrac"].append(vf_clipfrac.item())
            metrics["vpred_mean"].append(masked_mean(vpreds.detach(), mask).item())
        grad_norm = clip_grad_norm(self.module, float(cfg.get("grad_clip", 1.0) or 0.0))
        if torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.step()
            metrics["grad_norm"].append(grad_norm)
        else:
            self.nonfinite_skips += 1
        self.optimizer.zero_grad(set_to_none=True)
