"""LoRA on the actor (peft), with verl's keys `actor_rollout_ref.model.lora_rank` / `lora_alpha` / `target_modules`.

How it fits the hybrid engine:
- The adapters are injected into the plain HF model (`peft.inject_adapter_in_model`) before FSDP is applied, so
  the module keeps its HF class and FSDP shards base weights and adapters alike. peft freezes the base weights;
  only adapter parameters require grad, and only they go to the optimizer.
- Storage: the frozen base is kept in the compute dtype (the plan's `lora_base_dtype`, bf16 on GPUs: a forward
  never sees more of it) and the adapters in `fsdp_config.model_dtype` (fp32 masters for AdamW). FSDP2 casts
  both to its `param_dtype` for the all-gather, so one block's mixed storage costs nothing at compute time.
- The reference policy is the same module with its adapters switched off (`adapters_disabled`): no second copy.
- The rollout engine gets merged weights W + (alpha / rank)·B·A under the HF names, computed per tensor on each
  rank's own FSDP rows (`engine_parameters`): FSDP shards W and B on the same rows, so a rank's rows of the merged
  W need only its rows of B and the whole (small) A. The sum is taken in fp32 (a bf16 W would round a small
  update away) and cast to the engine dtype after. The module itself is never merged in place.
- Checkpoints hold the module's own state dict (base weights and adapters, each in its stored dtype), so a
  resume is exact;
  `merge_lora_state` turns such a state dict into the merged HF weights and a peft adapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from hybridrl.training.lora_linear import use_fused_forward

__all__ = ["LoraSettings", "lora_settings", "apply_lora", "has_lora", "adapters_disabled", "engine_parameters",
           "merge_lora_state", "adapter_param_count", "lora_target_names", "LINEAR_TARGETS"]

ADAPTER = "default"   # peft's name of the single adapter
# the decoder linears of the architectures the rollout engine runs (Qwen2/2.5, Llama 3, Qwen3)
LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_LORA_PARAM = re.compile(r"\.lora_(A|B)\." + ADAPTER + r"\.weight$")


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: float
    target_modules: tuple[str, ...] | str   # "all-linear" or module names

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> dict:
        targets = self.target_modules
        return {"rank": self.rank, "alpha": self.alpha,
                "target_modules": targets if isinstance(targets, str) else list(targets)}


def check_lora_keys(rank, alpha, targets, prefix: str = "actor_rollout_ref.model") -> list[str]:
    """Errors of the three LoRA keys, each naming the key, the value and the rule (empty when valid)."""
    errors = []
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        errors.append(f"'{prefix}.lora_rank' = {rank!r}: must be an integer >= 0 (0 = no LoRA)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        errors.append(f"'{prefix}.lora_alpha' = {alpha!r}: must be a number > 0 (the update is scaled by "
                      "lora_alpha / lora_rank)")
    names = [targets] if isinstance(targets, str) else targets
    if not (targets == "all-linear" or (isinstance(names, (list, tuple)) and names
                                        and all(n in LINEAR_TARGETS for n in names))):
        errors.append(f"'{prefix}.target_modules' = {targets!r}: use 'all-linear' or a non-empty list of "
                      f"{', '.join(LINEAR_TARGETS)}")
    return errors


def lora_settings(model_cfg) -> LoraSettings | None:
    """The actor's LoRA settings from the typed `actor_rollout_ref.model` section (ModelConfig: lora_rank,
    lora_alpha, target_modules), or None when `lora_rank` is 0 (full fine-tuning)."""
    rank, alpha, targets = model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules
    targets = targets if isinstance(targets, str) else list(targets)
    errors = check_lora_keys(rank, alpha, targets)
    if errors:
        raise ValueError("; ".join(errors))
    if rank == 0:
        return None
    return LoraSettings(int(rank), float(alpha), targets if isinstance(targets, str) else tuple(targets))


def apply_lora(model: torch.nn.Module, settings: LoraSettings, adapter_dtype: torch.dtype | None = None
               ) -> torch.nn.Module:
    """Inject the adapters into `model` (in place, before FSDP) on the decoder linears `settings.target_modules`
    names ('all-linear': LINEAR_TARGETS; an MoE layer's router and experts are not targeted); base weights are
    frozen and keep the dtype the model was loaded in. The adapters are stored in `adapter_dtype` (None: the base's dtype, or fp32 where peft
    upcasts a half-precision base's adapters). Dropout is 0 so that log-probs are deterministic (the old
    log-probs and the update's must agree). The linears compute through `lora_linear.lora_linear` (one GEMM
    accumulates the scaled adapter product into the base output) wherever that is the same function."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0, bias="none",
                        target_modules=_linear_targets(model, settings.target_modules))
    model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    use_fused_forward(_lora_layers(model).values())
    if adapter_dtype is not None:
        for layer in _lora_layers(model).values():
            layer.lora_A.to(adapter_dtype)
            layer.lora_B.to(adapter_dtype)
    model.hybridrl_lora = settings   # read by checkpoints (merge needs the scaling)
    return model


def _linear_targets(model: torch.nn.Module, target_modules) -> list[str]:
    """The target names that are nn.Linear modules of `model`. 'all-linear' means LINEAR_TARGETS, not peft's
    every-nn.Linear: peft would also wrap an MoE router and, through its names gate_proj / up_proj / down_proj,
    the 3-D expert tensors, which neither the plan's counts nor the engine's merge handle; an explicit name that
    is not a linear of this model (an MoE model's expert projections) is refused."""
    linears = {name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    names = lora_target_names(target_modules)
    if target_modules == "all-linear":
        return [n for n in names if n in linears]
    missing = [n for n in names if n not in linears]
    if missing:
        raise ValueError(f"'actor_rollout_ref.model.target_modules' = {list(names)}: {missing} are not linear layers "
                         f"of this model (its linears: {sorted(linears)}); LoRA on mixture-of-experts experts is not "
                         "supported — target the attention projections")
    return names


def _lora_layers(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Qualified name -> peft LoRA layer; empty without peft or without adapters."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return {}
    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


def has_lora(module: torch.nn.Module) -> bool:
    return getattr(module, "hybridrl_lora", None) is not None


@contextmanager
def adapters_disabled(module: torch.nn.Module):
    """Inside: the module computes with its base weights only (the reference policy). No-op without adapters."""
    layers = list(_lora_layers(module).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def _merged(w: torch.Tensor, b: torch.Tensor, a: torch.Tensor, scaling: float) -> torch.Tensor:
    """w + scaling·b·a summed in fp32 (whatever the stored dtypes), returned in fp32."""
    return torch.addmm(w.float(), b.float(), a.float(), alpha=scaling)


def _merge_fn(layer):
    """W_rows -> W_rows + scaling·B_rows·A in fp32 for this rank's rows of a LoRA-wrapped linear (local FSDP
    shard or the whole tensor); the caller casts to the engine dtype."""
    def merge(w: torch.Tensor) -> torch.Tensor:
        a, b = layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight
        a = a.full_tensor() if isinstance(a, DTensor) else a     # [rank, in]: small, gathered whole
        b = b.to_local() if isinstance(b, DTensor) else b        # [rows, rank]: the same rows as w
        if b.shape[0] != w.shape[0]:
            raise RuntimeError(f"LoRA merge: {b.shape[0]} rows of lora_B against {w.shape[0]} of the weight; "
                               "base weight and adapter must be sharded alike")
        return _merged(w, b.detach(), a.detach(), layer.scaling[ADAPTER])
    return merge


def engine_parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor, object]]:
    """(HF name, parameter, merge or None) for every weight the rollout engine loads. Without adapters: the
    module's parameters as they are. With adapters: adapter tensors are skipped, `x.base_layer.weight` is named
    `x.weight` and comes with the function that merges this rank's rows of it."""
    layers = _lora_layers(module)
    for name, p in module.named_parameters():
        if not layers:
            yield name, p, None
            continue
        if _LORA_PARAM.search(name):
            continue
        owner, _, leaf = name.rpartition(".base_layer.")
        if owner in layers:
            yield f"{owner}.{leaf}", p, _merge_fn(layers[owner]) if leaf == "weight" else None
        else:
            yield name, p, None


def merge_lora_state(state: Mapping[str, torch.Tensor], scaling: float) -> tuple[dict, dict]:
    """A module state dict with adapters -> (merged HF state dict, peft adapter state dict).

    Merged: `x.weight` = base + scaling·B·A, summed in fp32 and kept in the wider of the base's and the adapters'
    dtypes (a bf16 base with fp32 adapters gives fp32: the update is not rounded to bf16 here). Adapter keys follow peft's saved
    format (`base_model.model.<x>.lora_A.weight`), which `PeftModel.from_pretrained` loads onto the base model."""
    merged, adapter = {}, {}
    for key, value in state.items():
        m = _LORA_PARAM.search(key)
        if m:
            adapter[f"base_model.model.{key[:m.start()]}.lora_{m.group(1)}.weight"] = value
            continue
        owner, _, leaf = key.rpartition(".base_layer.")
        if not owner:
            merged[key] = value
            continue
        if leaf == "weight":
            a, b = state[f"{owner}.lora_A.{ADAPTER}.weight"], state[f"{owner}.lora_B.{ADAPTER}.weight"]
            value = _merged(value, b, a, scaling).to(torch.promote_types(value.dtype, b.dtype))
        merged[f"{owner}.{leaf}"] = value
    return merged, adapter


def adapter_param_count(shape, rank: int, target_modules) -> int:
    """Adapter parameters of a decoder of this `ModelShape` (plan/model_shape.py): rank·(in + out) per target."""
    if not rank:
        return 0
    q, kv, h, i = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    # MoE layers have no dense MLP linears (their experts are 3-D tensors, which LoRA does not target)
    layers = {n: shape.dense_layers if n in ("gate_proj", "up_proj", "down_proj") else shape.layers for n in dims}
    return sum(layers[n] * rank * sum(dims[n]) for n in lora_target_names(target_modules))


def lora_target_names(target_modules) -> list[str]:
    """The decoder linears a `target_modules` value names ('all-linear': every one of LINEAR_TARGETS)."""
    return list(LINEAR_TARGETS) if target_modules == "all-linear" else [target_modules] if isinstance(
        target_modules, str) else list(target_modules)
