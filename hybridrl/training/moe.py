"""Mixture-of-experts in the training forward: HF's Qwen3-MoE / Mixtral modules with grouped-GEMM experts, the
router's load-balancing and z-losses, and routing replay (the rollout's experts used in the training forward).

Shapes: N tokens of one forward (as the model sees them: padded rows flattened, or the packed row), L MoE layers,
E experts, k experts per token.

Choices:
- Experts: transformers (>= 5) dispatches its experts modules through `experts_implementation`; `load_kwargs`
  asks for hybridrl's `hybridrl_grouped_mm` (training/moe_experts.py: the (token, expert) assignments sorted by
  expert, gate|up and down as two grouped GEMMs, forward and backward) when an MoE model is loaded, so the
  training model never takes HF's Python loop over experts ('eager'). The model itself knows nothing of FSDP:
  FSDP shards the fused [E, 2I, H] / [E, H, I] expert tensors on their first dimension like any parameter.
- Routers are found by the class HF records router logits from (`_can_record_outputs["router_logits"]`, the
  same for both families); their module order is the MoE layers' order, which is also the order of the rollout
  engine's recorded experts (models/moe.py numbers the sparse layers the same way).
- `RouterTaps` puts one forward hook on each router; the hooks read the per-token data of the current forward
  (`set_tokens`: which rows are real tokens, the experts to replay) laid out like the model's input
  (training/packing.py `tokens_as_input`), so they work for padded, packed, shared-prompt and Ulysses forwards.
  With gradient checkpointing a layer's forward runs again in backward: the replayed experts stay set until the
  next `set_tokens`, so the recomputation routes the same way; router logits are collected only while
  `collecting` (the first forward), so the losses see each layer once.
- Replay (actor.router_replay.mode=R3): a token whose experts the rollout recorded (ids < E) takes those experts;
  their gates are the training router's own softmax probabilities at those experts (fp32, renormalised where the
  family renormalises, cast as the family casts — moe_config.py), so the router still gets gradients. Tokens
  without a record (padding, a sequence's last token, which the engine never ran) keep their own top k. Per
  layer the hook counts tokens whose own top-k set differs from the replayed one: `mismatch_frac`.
- Load-balancing loss: transformers' own `load_balancing_loss_func` of the model's family (Switch Transformer's
  E * sum_e f_e P_e over all MoE layers' logits, the padding masked out). z-loss (ST-MoE): the mean over real
  tokens and MoE layers of logsumexp(router logits)^2, in fp32. Both are computed over the tokens of one
  forward (under Ulysses, of this rank's slice).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from hybridrl.models.moe_config import moe_config
from hybridrl.training import moe_experts

__all__ = ["REPLAY_MODES", "is_moe", "load_kwargs", "router_settings", "RouterTaps", "router_z_loss",
           "load_balancing_loss"]


def is_moe(hf_config) -> bool:
    moe = moe_config(hf_config)
    return moe is not None and moe.num_sparse > 0


def load_kwargs(hf_config, experts_implementation: str | None = None) -> dict:
    """Extra `from_pretrained` / `from_config` arguments for this config: grouped-GEMM experts for MoE models
    (hybridrl's, moe_experts.py, unless `experts_implementation` names another of transformers' experts
    interface, e.g. its own 'grouped_mm' for an A/B)."""
    if not is_moe(hf_config):
        return {}
    return {"experts_implementation": experts_implementation or moe_experts.register()}


def router_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's routers in layer order (empty for a dense model)."""
    recorder = (getattr(model, "_can_record_outputs", None) or {}).get("router_logits")
    if recorder is None:
        return []
    return [m for m in model.modules() if isinstance(m, recorder.target_class)]


def router_z_loss(logits: list[torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens (`valid` [N] bool) and layers of logsumexp(logits [N, E])^2, fp32."""
    w = valid.float()
    per_layer = [(torch.logsumexp(x.float(), dim=-1).square() * w).sum() for x in logits]
    return torch.stack(per_layer).sum() / (w.sum().clamp(min=1) * len(logits))


def load_balancing_loss(model: torch.nn.Module, logits: list[torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """transformers' load-balancing loss of the model's family over these router logits, padding masked out."""
    routers = router_modules(model)
    family = sys.modules[type(routers[0]).__module__]
    moe = moe_config(model.config)
    return family.load_balancing_loss_func(tuple(logits), moe.num_experts, moe.top_k, valid.float())


REPLAY_MODES = ("disabled", "R3")


def router_settings(actor_config) -> tuple[bool, float, float]:
    """(replay the rollout's experts, load-balancing loss coefficient, z-loss coefficient) from the typed actor
    section (ActorConfig): `router_replay.mode`, `router_aux_loss_coef`, `router_z_loss_coef`."""
    mode = actor_config.router_replay.mode
    if mode not in REPLAY_MODES:
        raise ValueError(f"actor_rollout_ref.actor.router_replay.mode={mode!r} must be one of {REPLAY_MODES} "
                         "(R3: the rollout engine records each token's experts and the training forward replays "
                         "them; verl's R2, replaying the old-log-prob pass's own routing, is not implemented)")
    coefs = []
    for key in ("router_aux_loss_coef", "router_z_loss_coef"):
        value = float(getattr(actor_config, key))
        if value < 0:
            raise ValueError(f"actor_rollout_ref.actor.{key}={value} must be >= 0 (0 = off)")
        coefs.append(value)
    return mode == "R3", coefs[0], coefs[1]


class RouterTaps:
    """Forward hooks on an HF MoE model's routers: router logits for the losses, routing replay, the mismatch count
    (see the module docstring). `set_tokens` before a forward; `collecting()` around the forward whose logits the
    losses use."""

    def __init__(self, model: torch.nn.Module, replay: bool = False, collect_logits: bool = False):
        self.model = model
        self.routers = router_modules(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} (model_type {getattr(model.config, 'model_type', None)!r}) "
                             "has no MoE routers: actor.router_replay.mode, actor.router_aux_loss_coef and "
                             "actor.router_z_loss_coef apply to MoE models only (qwen3_moe, mixtral)")
        moe = moe_config(model.config)
        if moe is None:
            raise ValueError(f"model_type {model.config.model_type!r}: routing replay and router losses know the "
                             "routing of qwen3_moe and mixtral only")
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.norm_topk_prob = moe.norm_topk_prob
        self.replay, self.collect_logits = replay, collect_logits
        self.valid = self.routed = None       # [N] bool, [N, L, k] long: this forward's tokens
        self.logits: list[torch.Tensor] = []
        self._collecting = False
        self.mismatched = self.compared = None   # 0-d device tensors, summed over the layers of a forward
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    @property
    def num_layers(self) -> int:
        return len(self.routers)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def clear(self) -> None:
        """After a micro-batch's forward (and backward): the hooks pass routing through unchanged until the next
        `set_tokens` (a LoRA reference runs the same module without them)."""
        self.valid = self.routed = None
        self.logits = []

    def set_tokens(self, valid: torch.Tensor, routed: torch.Tensor | None = None) -> None:
        """The next forward's tokens as the model sees them: `valid` [N] (real tokens), `routed` [N, L, k] (the
        experts to replay; ids >= E: none recorded)."""
        if self.replay and routed is None:
            raise ValueError("actor.router_replay.mode=R3 needs the rollout's 'routed_experts' in the batch (the "
                             "native engine records them when the mode is R3)")
        if routed is not None and tuple(routed.shape[1:]) != (self.num_layers, self.top_k):
            raise ValueError(f"routed_experts has {tuple(routed.shape[1:])} (MoE layers, k) per token; this model "
                             f"has {self.num_layers} MoE layers routing to {self.top_k} experts")
        self.valid, self.routed = valid, routed
        self.logits = []
        zero = torch.zeros((), device=valid.device)
        self.mismatched, self.compared = zero.clone(), zero.clone()

    @contextmanager
    def collecting(self):
        self._collecting = True
        try:
            yield self
        finally:
            self._collecting = False

    def mismatch_frac(self) -> torch.Tensor:
        return self.mismatched / self.compared.clamp(min=1)

    def _hook(self, layer: int):
        def hook(module, args, output):
            logits, weights, ids = output
            if self.valid is None:   # not one of the owner's forwards
                return None
            if self._collecting and self.collect_logits:
                self.logits.append(logits)
            if self.routed is None:
                return None
            return logits, *self._replayed(layer, logits, weights, ids)
        return hook

    def _replayed(self, layer: int, logits_NE, weights_Nk, ids_Nk):
        recorded = self.routed[:, layer].long()
        use = self.valid & (recorded < self.num_experts).all(-1)
        own_set, replay_set = ids_Nk.sort(-1).values, recorded.sort(-1).values
        self.mismatched += ((own_set != replay_set).any(-1) & use).sum()
        self.compared += use.sum()
        chosen = torch.where(use[:, None], recorded, ids_Nk)
        probs = torch.softmax(logits_NE, dim=-1, dtype=torch.float32)
        gates = probs.gather(1, chosen)
        if self.norm_topk_prob:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return gates.to(weights_Nk.dtype), chosen   # the family's gate dtype: HF's router output has it
