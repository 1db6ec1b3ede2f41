"""DataParallelPPOActor: log-probs and the PPO policy update on an FSDP2-sharded HF causal LM (verl's dp_actor).

Shapes: B rows, R response length, V vocab.

Choices:
- `compute_log_prob` runs in micro-batches of `meta_info["micro_batch_size"]` (or token-balanced ones with
  `use_dynamic_bsz` + `max_token_len`) under no_grad; only one micro-batch of logits is ever on the GPU, and the
  [rows, R] results move to CPU together after the last one (no host sync between micro-batches); logits are
  divided by `meta_info["temperature"]`. Models whose head is a plain linear layer never materialise
  [rows, vocab] logits: the head is replaced by the chunked log-prob of training/fused_logprob.py (others, e.g.
  soft-capped logits, take the plain path). With several
  micro-batches and `meta_info["unshard_once"]` (true / "auto", fsdp.should_keep_unsharded) the FSDP blocks
  are all-gathered once for the pass, not once per micro-batch.
- `sp_group` (Ulysses sequence parallelism, training/ulysses.py): the ranks of the group hold the same rows and
  each runs 1/P of every packed micro-batch's tokens; results and metrics are identical on them.
- The settings are the typed `actor_rollout_ref.actor` section (ActorConfig) and, for an update, the run plan's
  per-rank sizes (`batches`, micro_batches.UpdateBatches); the reference is built without either of the latter.
- `update_policy`: ppo_epochs x mini-batches of `batches.mini_batch_rows` rows (per rank) x micro-batches of
  `batches.micro_rows` rows (or of at most `batches.max_tokens` tokens), accumulating gradients with exact weights
  (micro_batches.py). The loss is the policy loss registered as `policy_loss.loss_mode` (verl's registry: vanilla =
  PPO clip-higher + dual-clip, gspo, gpg, clip_cov, kl_cov, cispo; called with the actor section, which holds the
  clip ratios and policy_loss.*) - entropy_coeff * entropy + kl_loss_coef * KL(ref). A loss that fixes its own
  aggregation (gspo: seq-mean-token-mean, its `loss_agg_mode` attribute) is scaled across micro-batches by that
  mode.
- Gradients are clipped to `grad_clip`; a non-finite norm skips that optimizer step and is counted in
  `actor/grad_norm_nonfinite_skips`. The lr scheduler steps once per `update_policy` call (one training step),
  and `actor/lr` reports the lr that call used.
- The update never waits for the GPU between micro-batches (loss factors of a mini-batch read in one copy, metrics
  kept as device tensors until the end), so the host queues the next micro-batch while the GPU runs this one.
- Metrics are verl's names, each the mean over micro-batches (grad_norm: over mini-batches with a finite norm).
  `actor/entropy` is logged here only when entropy_coeff != 0 (it is then part of the loss); otherwise the
  trainer gets it from `compute_log_prob(calculate_entropy=True)` as newer verl does.
- MoE models (training/moe.py): with `router_replay.mode=R3` the old-log-prob pass and the update route every
  token the rollout recorded (`routed_experts`) to the rollout's experts, and `actor/routing_mismatch_frac` says how
  often the update's own top-k would have differed; `router_aux_loss_coef` / `router_z_loss_coef` add the router's
  load-balancing / z-loss (logged as `actor/router_aux_loss`, `actor/router_z_loss`), aggregated across
  micro-batches like the KL term. All off by default. The reference (built without an optimizer) routes on its own.
- Rollout correction (algorithms/rollout_correction.py): `rollout_is_weights` in the batch (computed by the driver
  from the old log-probs) multiply the per-token policy losses. Without `old_log_probs` (no old-log-prob pass)
  the weights come from the update's own detached log-probs vs `rollout_log_probs`, per micro-batch, with the
  level and threshold of `meta_info["rollout_is"]`; those log-probs are kept in `own_old_log_probs` (row order
  of the input) so the driver can report the rollout-vs-trainer metrics over the whole batch. With
  `meta_info["bypass"]` (verl's bypass mode) the rollout's log-probs are the old ones at any number of mini-batches
  and epochs and the policy loss is algorithms/bypass_mode.py's, its rejection and weights made per micro-batch.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from hybridrl.algorithms import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
    sum_pi_squared_from_logits,
)
from hybridrl.algorithms.bypass_mode import BypassLoss, bypass_policy_loss
from hybridrl.algorithms.rollout_correction import truncated_is_weights
from hybridrl.config.sections.actor import ActorConfig
from hybridrl.protocol import DataProto
from hybridrl.training.fsdp import keep_unsharded, should_keep_unsharded
from hybridrl.training.fused_logprob import fused_logprob_entropy, fused_sum_pi_squared, plain_linear_head
from hybridrl.training.micro_batches import (
    UpdateBatches,
    loss_scales,
    make_micro_batches,
    normaliser_count,
    sp_size_of,
)
from hybridrl.training.moe import RouterTaps, load_balancing_loss, router_settings, router_z_loss
from hybridrl.training.response_forward import forward_response_logits
from hybridrl.training.token_bins import restore_order
from hybridrl.training.transfer import to_device
from hybridrl.training.updater import FSDPUpdater

__all__ = ["DataParallelPPOActor"]

# what the forward reads (and moves to the device itself, packed or not); the loss's own tensors are the rest
FORWARD_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")


SUMMED_LOSSES = ("pg_loss", "kl_loss", "entropy")   # logged per mini-batch as the sum of the scaled micro-batch losses


@dataclass(frozen=True)
class _LossSettings:
    """How an update's loss is made: the rollout temperature, the aggregation of the loss (and of the policy loss,
    which a loss such as gspo fixes itself), its regularisers, and whether the update's own log-probs are the old
    ones (with the rollout-correction level and threshold it then applies itself), or the bypass mode's loss."""
    temperature: float
    mode: str
    pg_mode: str
    entropy_coeff: float
    use_kl_loss: bool
    own_old: bool
    rollout_is: dict | None
    bypass: BypassLoss | None = None


@dataclass
class _StreamState:
    """A streamed update in progress: the policy loss's aggregation, the provisional normaliser every part's loss
    was scaled by, the true one summed so far (a device tensor), metrics, and the lr and skip count at its start."""
    pg_mode: str
    provisional: float
    count: torch.Tensor
    lr: float
    skips_before: int
    metrics: dict = field(default_factory=lambda: defaultdict(list))


class DataParallelPPOActor(FSDPUpdater):
    SECTION = ActorConfig

    def __init__(self, config: ActorConfig, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler=None, batches: UpdateBatches | None = None, use_remove_padding: bool = False,
                 sp_group=None, activation_offload: bool = False, share_prompts: bool = False):
        super().__init__(config, module, optimizer, scheduler, batches, use_remove_padding, activation_offload)
        self.sp_group = sp_group  # Ulysses: every rank of this group gets the same rows and runs 1/P of the tokens
        self.share_prompts = share_prompts  # the plan's use_prefix_grouper: a micro-batch's rows run each prompt once
        self.fused_head = plain_linear_head(module)
        self.own_old_log_probs: torch.Tensor | None = None  # [B, R] on CPU after an update without old_log_probs
        self.replay, self.router_aux_coef, self.router_z_coef = router_settings(config)
        self.routing = None   # the MoE router hooks of the trained policy (training/moe.py)
        self._stream: _StreamState | None = None   # a streamed update in progress (begin_streamed_update)
        if optimizer is not None and (self.replay or self.router_aux_coef or self.router_z_coef):
            self.routing = RouterTaps(module, replay=self.replay,
                                      collect_logits=bool(self.router_aux_coef or self.router_z_coef))

    def _forward_inputs(self, data: DataProto | None = None) -> list[str]:
        """What the forward reads of `data`: the tokens and, replaying routing, the rollout's experts."""
        if self.routing is None or not self.replay:
            return [*FORWARD_INPUTS]
        if data is not None and "routed_experts" not in data.batch:
            raise ValueError("actor.router_replay.mode=R3 needs the rollout's 'routed_experts' in the batch (the "
                             "native engine records them when the mode is R3)")
        return [*FORWARD_INPUTS, "routed_experts"]

    # ------------------------------------------------------------------ forward
    def _forward_micro_batch(self, micro: DataProto, temperature: float, calculate_entropy: bool,
                             entropy_grad: bool = False, sum_pi_squared: bool = False):
        """(log_probs, entropy or None, Σπ² or None) of the response tokens; the entropy carries a gradient only
        with `entropy_grad` (it is in the loss), else it is a detached measurement (no backward work); Σπ² (the
        sum of the squared token probabilities, the optimal token baseline's term) is always a measurement."""
        b = micro.batch
        responses = to_device(b["responses"], self.device)
        targets = responses.reshape(-1)

        def per_token(rows, flat):  # [K, V] logits of the kept positions -> [K, 1-3]: log-prob (, entropy) (, Σπ²)
            logits = rows.float() / temperature
            stats = [logprobs_from_logits(logits, targets[flat])]
            if calculate_entropy:
                stats.append(entropy_from_logits(logits if entropy_grad else logits.detach()))
            if sum_pi_squared:
                stats.append(sum_pi_squared_from_logits(logits.detach()))
            return torch.stack(stats, dim=-1)

        def fused(hidden, weight, flat):  # the head's [K, V] logits exist one chunk at a time (fused_logprob.py)
            out = fused_logprob_entropy(hidden, weight, targets[flat], temperature, calculate_entropy, entropy_grad)
            if not sum_pi_squared:
                return out if calculate_entropy else out[:, :1]
            return torch.cat([out if calculate_entropy else out[:, :1],
                              fused_sum_pi_squared(hidden.detach(), weight.detach(), temperature)[:, None]], dim=-1)

        token_data = on_tokens = None
        if self.routing is not None:  # the router hooks see which tokens are real and, replaying, their experts
            token_data = {"valid": b["attention_mask"].bool()}
            if "routed_experts" in b:
                token_data["routed"] = b["routed_experts"]
            on_tokens = lambda t: self.routing.set_tokens(t["valid"], t.get("routed"))  # noqa: E731
        out = forward_response_logits(self.module, b["input_ids"], b["attention_mask"], b["position_ids"],
                                      responses.shape[1], self.use_remove_padding, keep_only_needed=True,
                                      sp_group=self.sp_group, row_fn=None if self.fused_head else per_token,
                                      head_rows=fused if self.fused_head else None,
                                      share_prompts=self.share_prompts, device=self.device,
                                      token_data=token_data, on_tokens=on_tokens)
        return (out[..., 0], out[..., 1] if calculate_entropy else None,
                out[..., -1] if sum_pi_squared else None)

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """Returns (log_probs [B, R] on CPU, entropy [B, R] on CPU or None)."""
        stats = self.compute_log_prob_stats(data, calculate_entropy)
        return stats["log_probs"], stats.get("entropy")

    def compute_log_prob_stats(self, data: DataProto, calculate_entropy: bool = False,
                               calculate_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """{"log_probs", and "entropy" / "sum_pi_squared" where asked}: [B, R] fp32 on CPU, in `data`'s row order."""
        meta = data.meta_info
        if "temperature" not in meta:
            raise ValueError("compute_log_prob: meta_info['temperature'] is required (the rollout temperature)")
        self.module.eval()
        data = data.select(self._forward_inputs(data))
        micros, bins = make_micro_batches(data, bool(meta.get("use_dynamic_bsz", False)),
                                          meta.get("micro_batch_size"), meta.get("max_token_len"),
                                          size_key="log_prob_micro_batch_size_per_gpu",
                                          token_key="log_prob_max_token_len_per_gpu", share_prompts=self.share_prompts,
                                          sp_size=sp_size_of(self.sp_group))
        parts: dict[str, list[torch.Tensor]] = defaultdict(list)
        once = should_keep_unsharded(self.module, meta.get("unshard_once", False), len(micros), self.device)
        with torch.no_grad(), keep_unsharded(self.module, once):
            for micro in micros:  # results stay on the device until the pass ends: no host sync per micro-batch
                with self._routed():
                    out = self._forward_micro_batch(micro, float(meta["temperature"]), calculate_entropy,
                                                    sum_pi_squared=calculate_sum_pi_squared)
                for key, value in zip(("log_probs", "entropy", "sum_pi_squared"), out):
                    if value is not None:
                        parts[key].append(value.float())
        return {key: restore_order(values, bins).cpu() for key, values in parts.items()}

    # ------------------------------------------------------------------ update
    def _loss_settings(self, data: DataProto) -> tuple[DataProto, _LossSettings]:
        """What an update reads of `data` (selected) and how its loss is made from it."""
        cfg = self.config
        if self.optimizer is None:
            raise ValueError("update_policy needs an optimizer (this actor was built for log-probs only)")
        if "temperature" not in data.meta_info:
            raise ValueError("update_policy: meta_info['temperature'] is required (the rollout temperature)")
        # without 'old_log_probs' (no old-log-prob pass: one on-policy mini-batch) the update's own log-probs,
        # detached, are the old ones: ratio 1, the same gradient, one forward pass less per step
        keys = [*self._forward_inputs(data), "response_mask", "advantages"]
        bypass = data.meta_info.get("bypass")
        bypass = None if bypass is None else BypassLoss(**bypass)
        own_old = "old_log_probs" not in data.batch
        if bypass is not None and not own_old:
            raise ValueError("algorithm.rollout_correction.bypass_mode takes the rollout's log-probs as the old ones, "
                             "but the batch has 'old_log_probs' (an old-log-prob pass ran)")
        if not own_old:
            keys.append("old_log_probs")
        elif "rollout_log_probs" in data.batch:  # the rollout-vs-trainer weights, made from the update's forward
            keys.append("rollout_log_probs")
        if "rollout_is_weights" in data.batch:
            keys.append("rollout_is_weights")
        rollout_is = data.meta_info.get("rollout_is") if own_old and bypass is None else None
        if (rollout_is is not None or bypass is not None) and "rollout_log_probs" not in data.batch:
            what = "bypass_mode is true" if bypass is not None else "rollout_is is set"
            raise ValueError(f"algorithm.rollout_correction.{what} but the batch has no 'rollout_log_probs'")
        if cfg.use_kl_loss:
            if "ref_log_prob" not in data.batch:
                raise ValueError("actor.use_kl_loss=true needs 'ref_log_prob' in the batch (enable the reference "
                                 "policy)")
            keys.append("ref_log_prob")
        data = data.select(keys)
        if own_old:  # shuffling and dynamic micro-batches reorder rows: the index puts the log-probs back
            data.batch["row_index"] = torch.arange(len(data), device=data.batch["responses"].device)
        mode = cfg.loss_agg_mode
        pg_mode = mode if bypass is not None else getattr(self._policy_loss_fn(), "loss_agg_mode", mode)
        return data, _LossSettings(float(data.meta_info["temperature"]), mode, pg_mode, float(cfg.entropy_coeff),
                                   cfg.use_kl_loss, own_old, rollout_is, bypass)

    def update_policy(self, data: DataProto) -> dict[str, float]:
        data, loss = self._loss_settings(data)
        self.own_old_log_probs = None
        if loss.own_old:
            self.own_old_log_probs = torch.zeros(data.batch["responses"].shape, dtype=torch.float32,
                                                 device=self.device)
        out = self._train_step(data, "actor", lambda mini, metrics: self._update_mini_batch(mini, loss, metrics))
        if loss.own_old:
            self.own_old_log_probs = self.own_old_log_probs.cpu()
        return out

    # ------------------------------------------------------------------ streamed update
    def begin_streamed_update(self, rows: int, response_length: int) -> None:
        """Start one optimizer step's update whose rows arrive in parts (`accumulate`), `rows` in all, each with at
        most `response_length` response tokens; `finish_streamed_update` steps. The loss of every part is scaled by
        a fixed provisional normaliser (`rows`, times `response_length` for token-mean) and the gradient by the
        provisional over the true one at the end, so the result equals `update_policy` on all the rows at once:
        one mini-batch, one epoch, as the plan's early update requires."""
        if self.optimizer is None:
            raise ValueError("begin_streamed_update needs an optimizer (this actor was built for log-probs only)")
        cfg = self.config
        if cfg.ppo_epochs != 1:
            raise ValueError(f"a streamed update is one pass over the rows: actor.ppo_epochs={cfg.ppo_epochs} must be 1")
        pg_mode = getattr(self._policy_loss_fn(), "loss_agg_mode", cfg.loss_agg_mode)
        regularised = cfg.entropy_coeff != 0 or cfg.use_kl_loss or self.router_aux_coef or self.router_z_coef
        if pg_mode != cfg.loss_agg_mode and regularised:
            raise ValueError(f"a streamed update scales its gradient once at the end: the policy loss aggregates "
                             f"with {pg_mode!r}, its regularisers with actor.loss_agg_mode={cfg.loss_agg_mode!r}")
        provisional = float(rows * (response_length if pg_mode == "token-mean" else 1))
        self._stream = _StreamState(pg_mode, provisional, torch.zeros((), device=self.device),
                                    self.optimizer.param_groups[0]["lr"], self.nonfinite_skips)
        self._offload_stats = {}
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)

    def accumulate(self, data: DataProto) -> torch.Tensor | None:
        """Forward and backward over one part of a streamed update; returns its rows' own old log-probs [B, R] on
        the CPU (no old-log-prob pass) or None."""
        st = self._stream
        if st is None:
            raise RuntimeError("accumulate: no streamed update begun (begin_streamed_update)")
        data, loss = self._loss_settings(data)
        if loss.pg_mode != st.pg_mode:
            raise ValueError(f"accumulate: the policy loss aggregates with {loss.pg_mode!r}, the update began with "
                             f"{st.pg_mode!r}")
        sizes = self.batches
        micros, _ = make_micro_batches(data, sizes.dynamic, sizes.micro_rows, sizes.max_tokens,
                                       share_prompts=self.share_prompts, sp_size=sp_size_of(self.sp_group))
        counts = [normaliser_count(m.batch["response_mask"], st.pg_mode).to(self.device) for m in micros]
        st.count = st.count + torch.stack(counts).sum()
        self.own_old_log_probs = None
        if loss.own_old:
            self.own_old_log_probs = torch.zeros(data.batch["responses"].shape, dtype=torch.float32,
                                                 device=self.device)
        scale = [c / st.provisional if st.pg_mode != "seq-mean-token-sum-norm" else 1.0 for c in counts]
        try:
            with keep_unsharded(self.module, sizes.unshard_once, backward=True):
                self._micro_steps(micros, scale, scale, loss, st.metrics)
        finally:
            if self.reduce_in_last_backward:
                self.module.set_requires_gradient_sync(True)
        own, self.own_old_log_probs = self.own_old_log_probs, None
        return None if own is None else own.cpu()

    def finish_streamed_update(self) -> dict[str, float]:
        """The streamed update's gradient put on the true normaliser, clipped and applied; its metrics."""
        st, self._stream = self._stream, None
        if st is None:
            raise RuntimeError("finish_streamed_update: no streamed update begun (begin_streamed_update)")
        factor = 1.0
        if st.pg_mode != "seq-mean-token-sum-norm":
            count = float(st.count.item())
            factor = st.provisional / count if count > 0 else 0.0
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        for key in SUMMED_LOSSES:   # each part logged its losses on the provisional normaliser: one update's worth
            if st.metrics.get(key):
                st.metrics[key] = [sum(st.metrics[key]) * factor]
        self._optimizer_step(st.metrics)
        if self.scheduler is not None:
            self.scheduler.step()
        return self._step_metrics("actor", st.metrics, st.lr, st.skips_before)

    def _collecting(self):
        """Around the forward whose router logits the router losses read (not the recomputation in backward)."""
        return self.routing.collecting() if self.routing is not None else nullcontext()

    @contextmanager
    def _routed(self):
        """Around one micro-batch's forward (and backward): the router hooks act on it only."""
        try:
            yield
        finally:
            if self.routing is not None:
                self.routing.clear()

    def _router_losses(self, metrics) -> torch.Tensor:
        """The router terms of the loss (0 for a dense model or with both coefficients 0), their metrics and, when
        replaying, the share of tokens whose own routing differed."""
        taps = self.routing
        loss = torch.zeros((), device=self.device)
        if taps is None:
            return loss
        if self.replay:
            metrics["routing_mismatch_frac"].append(taps.mismatch_frac())
        if self.router_aux_coef:
            aux = load_balancing_loss(self.module, taps.logits, taps.valid)
            loss = loss + self.router_aux_coef * aux
            metrics["router_aux_loss"].append(aux.detach())
        if self.router_z_coef:
            z = router_z_loss(taps.logits, taps.valid)
            loss = loss + self.router_z_coef * z
            metrics["router_z_loss"].append(z.detach())
        return loss

    def _policy_loss_fn(self):
        return get_policy_loss_fn(self.config.policy_loss.loss_mode)

    def _update_mini_batch(self, mini: DataProto, loss: _LossSettings, metrics):
        sizes = self.batches
        micros, _ = make_micro_batches(mini, sizes.dynamic, sizes.micro_rows, sizes.max_tokens,
                                       share_prompts=self.share_prompts, sp_size=sp_size_of(self.sp_group))
        self._micro_steps(micros, loss_scales(micros, loss.pg_mode), loss_scales(micros, loss.mode), loss, metrics)

    def _micro_steps(self, micros: list[DataProto], pg_scales, scales, loss: _LossSettings, metrics) -> None:
        """Forward and backward of each micro-batch, its policy loss times `pg_scales[i]` and its regularisers
        times `scales[i]`; the last backward completes the gradients."""
        cfg, policy_loss_fn = self.config, self._policy_loss_fn()
        mode, entropy_coeff, own_old = loss.mode, loss.entropy_coeff, loss.own_old
        # metrics stay 0-d device tensors until the update ends: no host sync between micro-batches. The losses are
        # logged as the mini-batch's (each micro-batch's times its scale, summed, as verl sums them), so they do not
        # depend on how the mini-batch was cut into micro-batches; the other metrics are means over micro-batches
        sums: dict[str, torch.Tensor] = {}
        for i, (micro, pg_scale, scale) in enumerate(zip(micros, pg_scales, scales)):
            b = {k: to_device(v, self.device) for k, v in micro.batch.items() if k not in self._forward_inputs()}
            mask = b["response_mask"]
            with self._routed():  # the router hooks act on this micro-batch's forward and its recomputation
                # entropy is part of the loss with entropy_coeff, and the step's metric when no old-log-prob pass
                # made it
                with self.training_forward(), self._collecting():
                    log_prob, entropy, _ = self._forward_micro_batch(micro, loss.temperature,
                                                                     calculate_entropy=entropy_coeff != 0 or own_old,
                                                                     entropy_grad=entropy_coeff != 0)
                old_log_prob = log_prob.detach() if own_old else b["old_log_probs"]
                is_weights = b.get("rollout_is_weights")
                if own_old:
                    self.own_old_log_probs[b["row_index"]] = old_log_prob.float()
                    rollout_is = loss.rollout_is
                    if rollout_is is not None:  # per token or per row: the same weights a whole-batch pass gives
                        is_weights = truncated_is_weights(old_log_prob - b["rollout_log_probs"], mask,
                                                          rollout_is["level"], float(rollout_is["threshold"]))
                if loss.bypass is not None:   # the rollout's log-probs are the old ones (algorithms/bypass_mode.py)
                    pg_loss, pg_metrics = bypass_policy_loss(log_prob, b["rollout_log_probs"], b["advantages"], mask,
                                                             mode, cfg, loss.bypass)
                else:
                    pg_loss, pg_metrics = policy_loss_fn(old_log_prob, log_prob, b["advantages"], mask,
                                                         loss_agg_mode=mode, config=cfg, rollout_is_weights=is_weights)
                # entropy, KL and router terms, aggregated with `mode`
                regularisers = self._router_losses(metrics)
                if entropy is not None:
                    entropy_loss = agg_loss(entropy, mask, mode, loss_scale_factor=cfg.loss_scale_factor)
                    if entropy_coeff != 0:
                        regularisers = regularisers - entropy_coeff * entropy_loss
                    sums["entropy"] = sums.get("entropy", 0.0) + entropy_loss.detach() * scale
                if loss.use_kl_loss:
                    kld = kl_penalty(log_prob, b["ref_log_prob"], cfg.kl_loss_type)
                    kl_loss = agg_loss(kld, mask, mode, loss_scale_factor=cfg.loss_scale_factor)
                    regularisers = regularisers + float(cfg.kl_loss_coef) * kl_loss
                    sums["kl_loss"] = sums.get("kl_loss", 0.0) + kl_loss.detach() * scale
                    metrics["kl_coef"].append(float(cfg.kl_loss_coef))   # verl's actor/kl_coef
                total = pg_loss * pg_scale + regularisers * scale
                self.backward(total, last=i == len(micros) - 1)
            sums["pg_loss"] = sums.get("pg_loss", 0.0) + pg_loss.detach() * pg_scale
            for key, value in pg_metrics.items():  # verl's actor/pg_clipfrac, actor/ppo_kl, ...: prefixed by the updater
                metrics[key.removeprefix("actor/")].append(value)
        for key, value in sums.items():
            metrics[key].append(value)
