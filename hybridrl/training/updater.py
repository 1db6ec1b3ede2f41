"""What the PPO actor and critic updates share: one training step = ppo_epochs × mini-batches, each ending in one
optimizer step with gradient clipping; a non-finite gradient norm skips that step and is counted; the lr
scheduler steps once per training step; metrics are means over micro-batches, prefixed by the role. Where FSDP
shards over one rank (`fsdp.grads_unsplit`) gradients are reduced once per mini-batch, in its last backward. With
`batches.unshard_once` (the run plan's choice) the blocks are all-gathered once per mini-batch instead of twice per
micro-batch (forward, and again for backward), for the memory of the model's unsharded compute-dtype copy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor

from hybridrl.protocol import DataProto
from hybridrl.training.activation_offload import maybe_offload
from hybridrl.training.fsdp import grads_unsplit, keep_unsharded
from hybridrl.training.micro_batches import UpdateBatches, iter_mini_batches


def clip_grad_norm(module: torch.nn.Module, max_norm: float) -> float:
    """Clip (DTensor-aware) and return the total norm before clipping as a float (may be inf/nan)."""
    params = [p for p in module.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm if max_norm and max_norm > 0 else float("inf"))
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm.item())


def _mean(values: dict[str, list]) -> dict[str, float]:
    """Per key the mean of its floats or 0-d tensors (the tensors' one device-to-host read happens here)."""
    return {k: float(sum(v) / len(v)) for k, v in values.items() if v}


class FSDPUpdater:
    """`config`: the role's typed config section, of the subclass's `SECTION` type (ActorConfig, CriticConfig: with
    ppo_epochs, shuffle, grad_clip and the loss's keys); `batches`: the run plan's per-rank sizes of an update (None
    for a model that only runs forwards, e.g. the reference)."""

    SECTION: type   # the config section class the subclass is built from

    def __init__(self, config, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
                 batches: UpdateBatches | None, use_remove_padding: bool, activation_offload: bool = False):
        if not isinstance(config, self.SECTION):
            raise TypeError(f"{type(self).__name__}: config must be the typed {self.SECTION.__name__} section (as "
                            f"load_config returns it), got {type(config).__name__}")
        if optimizer is not None and not isinstance(batches, UpdateBatches):
            raise TypeError(f"{type(self).__name__}: an optimizer needs `batches` (UpdateBatches, the run plan's "
                            f"per-rank update sizes), got {type(batches).__name__}")
        self.config = config
        self.batches = batches
        self.activation_offload = activation_offload   # model.enable_activation_offload (training/activation_offload.py)
        self._offload_stats: dict[str, int] = {}
        self.module = module
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.use_remove_padding = use_remove_padding
        self.device = next(module.parameters()).device
        self.nonfinite_skips = 0
        self.reduce_in_last_backward = grads_unsplit(module)
        # called at the start of every optimizer step: where the hybrid engine offloads the optimizer state, it
        # returns to the GPU there, after the backward has freed the activations, not before the forward
        self.before_optimizer_step: Callable[[], None] | None = None

    def _train_step(self, data: DataProto, role: str, mini_step: Callable[[DataProto, dict], None]) -> dict[str, float]:
        """Run `mini_step(mini_batch, metrics)` (forward/backward over its micro-batches) for every mini-batch, each
        followed by an optimizer step; returns `{role}/...` metrics."""
        metrics: dict[str, list[float]] = defaultdict(list)
        lr = self.optimizer.param_groups[0]["lr"]
        skips_before = self.nonfinite_skips
        self._offload_stats = {}
        self.module.train()
        cfg = self.config
        for mini in iter_mini_batches(data, self.batches.mini_batch_rows, cfg.ppo_epochs, cfg.shuffle):
            self.optimizer.zero_grad(set_to_none=True)
            try:   # the unsharded copies are dropped before the optimizer step changes the sharded weights
                with keep_unsharded(self.module, self.batches.unshard_once, backward=True):
                    mini_step(mini, metrics)
            finally:
                if self.reduce_in_last_backward:
                    self.module.set_requires_gradient_sync(True)
            self._optimizer_step(metrics)
        if self.scheduler is not None:
            self.scheduler.step()
        return self._step_metrics(role, metrics, lr, skips_before)

    def _step_metrics(self, role: str, metrics: dict, lr: float, skips_before: int) -> dict[str, float]:
        """A training step's `{role}/...` metrics: the means over micro-batches, the lr it used, its skipped
        optimizer steps and offloaded activations."""
        out = {f"{role}/{k}": v for k, v in _mean(metrics).items()}
        out[f"{role}/lr"] = lr
        out[f"{role}/grad_norm_nonfinite_skips"] = float(self.nonfinite_skips - skips_before)
        if self.activation_offload:
            out[f"{role}/activation_offload_gb"] = self._offload_stats.get("bytes", 0) / 2**30
        return out

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """One micro-batch's backward; `last`: the mini-batch's last, after which the gradients are complete."""
        if self.reduce_in_last_backward:
            self.module.set_requires_gradient_sync(last)
        loss.backward()

    def training_forward(self):
        """Context for a forward whose graph the next backward uses: with activation offload its saved tensors go
        to host memory (counted in `{role}/activation_offload_gb`)."""
        return maybe_offload(self.activation_offload, self._offload_stats)

    def _optimizer_step(self, metrics: dict) -> None:
        if self.before_optimizer_step is not None:
            self.before_optimizer_step()
        grad_norm = clip_grad_norm(self.module, self.config.grad_clip)
        if torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.step()
            metrics["grad_norm"].append(grad_norm)
        else:
            self.nonfinite_skips += 1
        self.optimizer.zero_grad(set_to_none=True)
