"""DataParallelPPOCritic: values and the clipped value-loss update on an FSDP2-sharded value model.

The value model is HF's `AutoModelForTokenClassification(num_labels=1)` (backbone + linear score head).
Values [B, R] are the head outputs at the positions *before* each response token (the state the token is
chosen in), as in verl, multiplied by response_mask. Micro-batching, accumulation weights, grad clipping and
the non-finite-norm skip follow the actor (see actor.py); metrics: `critic/vf_loss`, `critic/vf_clipfrac`,
`critic/vpred_mean`, `critic/grad_norm`, `critic/lr`, `critic/grad_norm_nonfinite_skips`.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms import compute_value_loss, masked_mean
from hybridrl.config.sections.critic import CriticConfig
from hybridrl.protocol import DataProto
from hybridrl.training.fsdp import keep_unsharded, should_keep_unsharded
from hybridrl.training.micro_batches import UpdateBatches, loss_scales, make_micro_batches, sp_size_of
from hybridrl.training.response_forward import forward_response_logits
from hybridrl.training.token_bins import restore_order
from hybridrl.training.transfer import to_device
from hybridrl.training.updater import FSDPUpdater

__all__ = ["DataParallelPPOCritic"]


class DataParallelPPOCritic(FSDPUpdater):
    """`config`: the typed `critic` section; `batches`: the run plan's per-rank update sizes; `use_remove_padding`:
    the plan's choice (packed forwards); `activation_offload`: critic.model.enable_activation_offload."""

    SECTION = CriticConfig

    def __init__(self, config: CriticConfig, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler=None, batches: UpdateBatches | None = None, use_remove_padding: bool = False,
                 sp_group=None, share_prompts: bool = False, activation_offload: bool = False):
        super().__init__(config, module, optimizer, scheduler, batches, use_remove_padding, activation_offload)
        self.sp_group = sp_group  # Ulysses, as in the actor (training/ulysses.py)
        self.share_prompts = share_prompts  # each prompt once per micro-batch, as in the actor (training/packing.py)

    def _forward_micro_batch(self, micro: DataProto, mask: torch.Tensor) -> torch.Tensor:
        """Values [B, R] of the micro-batch, zero outside `mask` (its response_mask, already on the device)."""
        b = micro.batch
        response_length = b["responses"].shape[1]
        out = forward_response_logits(self.module, b["input_ids"], b["attention_mask"], b["position_ids"],
                                      response_length, self.use_remove_padding, keep_only_needed=False,
                                      sp_group=self.sp_group, share_prompts=self.share_prompts, device=self.device)
        return out[..., 0].float() * mask

    def compute_values(self, data: DataProto) -> torch.Tensor:
        """values [B, R] on CPU; micro-batches from meta_info (the plan's micro_batch_size, or use_dynamic_bsz with
        max_token_len)."""
        meta = data.meta_info
        self.module.eval()
        data = data.select(["responses", "input_ids", "attention_mask", "position_ids", "response_mask"])
        micros, bins = make_micro_batches(
            data, bool(meta.get("use_dynamic_bsz", False)),
            meta.get("micro_batch_size"), meta.get("max_token_len"),
            size_key="critic.forward_micro_batch_size_per_gpu", token_key="critic.forward_max_token_len_per_gpu",
            share_prompts=self.share_prompts, sp_size=sp_size_of(self.sp_group))
        once = should_keep_unsharded(self.module, meta.get("unshard_once", False), len(micros), self.device)
        with torch.no_grad(), keep_unsharded(self.module, once):
            values = [self._forward_micro_batch(m, to_device(m.batch["response_mask"], self.device))
                      for m in micros]  # to CPU after the last: no sync between
        return restore_order(values, bins).cpu()

    def update_critic(self, data: DataProto) -> dict[str, float]:
        if self.optimizer is None:
            raise ValueError("update_critic needs an optimizer")
        data = data.select(["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "values",
                            "returns"])
        mode = self.config.loss_agg_mode
        return self._train_step(data, "critic", lambda mini, metrics: self._update_mini_batch(mini, mode, metrics))

    def _update_mini_batch(self, mini: DataProto, mode: str, metrics):
        sizes = self.batches
        micros, _ = make_micro_batches(mini, sizes.dynamic, sizes.micro_rows, sizes.max_tokens,
                                       size_key="critic.ppo_micro_batch_size_per_gpu",
                                       token_key="critic.ppo_max_token_len_per_gpu", share_prompts=self.share_prompts,
                                       sp_size=sp_size_of(self.sp_group))
        for i, (micro, scale) in enumerate(zip(micros, loss_scales(micros, mode))):  # no host sync between them
            mask = to_device(micro.batch["response_mask"], self.device)
            with self.training_forward():
                vpreds = self._forward_micro_batch(micro, mask)
            vf_loss, vf_clipfrac = compute_value_loss(vpreds, to_device(micro.batch["returns"], self.device),
                                                      to_device(micro.batch["values"], self.device), mask,
                                                      cliprange_value=float(self.config.cliprange_value),
                                                      loss_agg_mode=mode)
            self.backward(vf_loss * scale, last=i == len(micros) - 1)
            metrics["vf_loss"].append(vf_loss.detach())
            metrics["vf_clipfrac"].append(vf_clipfrac.detach())
            metrics["vpred_mean"].append(masked_mean(vpreds.detach(), mask))
