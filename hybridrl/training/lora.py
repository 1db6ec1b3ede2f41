"""LoRA on the actor (peft), with verl's keys `actor_rollout_ref.model.lora_rank` / `lora_alpha` / `target_modules`,
and peft's `target_parameters` for the 3-D expert tensors of a mixture-of-experts model.

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
- Experts (`target_parameters`: experts.gate_up_proj, experts.down_proj): peft's `ParamWrapper` adapts the fused
  [E, out, in] tensor with lora_A [E·r, in] (expert e's rows e·r .. e·r+r-1) and lora_B [out, r·E] (expert e's
  columns e, e+E, .. : peft reshapes it to [out, r, E]); expert e's update is scaling·B_e·A_e, applied in the
  training forward as a parametrization of the base tensor (W never changes; autograd keeps the rebuilt
  W + scaling·B·A for backward: the plan's `expert LoRA copies`). The engine's merge (`ExpertMerge`) gathers both
  factors whole (E·r·(in + out): small) and adds the update of this rank's FSDP rows of W, which are whole experts;
  where the engine borrows W instead (TP = 1, one rank: hybrid/reshard.py) it gets those factors (`factors()`) and
  adds the update unmerged (models/moe.py).
  Several targets on one experts module nest (the module's first parameter innermost), so a weight's HF name is its
  module path with every `.base_layer` dropped.
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

__all__ = ["LoraSettings", "lora_settings", "apply_lora", "load_adapter_weights", "has_lora", "adapters_disabled",
           "engine_parameters", "merge_lora_state", "adapter_param_count", "lora_target_names", "LINEAR_TARGETS", "EXPERT_TARGETS"]

ADAPTER = "default"   # peft's name of the single adapter
# the decoder linears of the architectures the rollout engine runs (Qwen2/2.5, Llama 3, Qwen3)
LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the fused expert tensors of transformers 5's MoE experts modules (Qwen3-MoE, Mixtral), as peft's target_parameters
EXPERT_TARGETS = ("experts.gate_up_proj", "experts.down_proj")
_LORA_PARAM = re.compile(r"\.lora_(A|B)\." + ADAPTER + r"\.weight$")


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: float
    target_modules: tuple[str, ...] | str   # "all-linear" or module names (empty: experts only)
    target_parameters: tuple[str, ...] = ()  # EXPERT_TARGETS names: the MoE experts' 3-D tensors
    adapter_path: str | None = None           # a peft adapter directory the adapters start from (load_adapter_weights)
    exclude_modules: str | tuple[str, ...] | None = None   # peft's: targets that get no adapter (regex or names)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> dict:
        targets = self.target_modules
        exclude = self.exclude_modules
        return {"rank": self.rank, "alpha": self.alpha,
                "target_modules": targets if isinstance(targets, str) else list(targets),
                "target_parameters": list(self.target_parameters),
                "exclude_modules": exclude if exclude is None or isinstance(exclude, str) else list(exclude)}


def check_lora_keys(rank, alpha, targets, parameters=None, prefix: str = "actor_rollout_ref.model") -> list[str]:
    """Errors of the LoRA keys, each naming the key, the value and the rule (empty when valid). `parameters` is
    `target_parameters` (None or empty: no expert adapters); with expert targets, `target_modules` may be empty."""
    errors = []
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        errors.append(f"'{prefix}.lora_rank' = {rank!r}: must be an integer >= 0 (0 = no LoRA)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        errors.append(f"'{prefix}.lora_alpha' = {alpha!r}: must be a number > 0 (the update is scaled by "
                      "lora_alpha / lora_rank)")
    experts = list(parameters or [])
    if parameters is not None and not (isinstance(parameters, (list, tuple))
                                       and all(n in EXPERT_TARGETS for n in parameters)
                                       and len(set(experts)) == len(experts)):
        errors.append(f"'{prefix}.target_parameters' = {parameters!r}: use null or a list of distinct "
                      f"{', '.join(EXPERT_TARGETS)} (the mixture-of-experts experts' fused tensors)")
    elif experts and rank == 0:
        errors.append(f"'{prefix}.target_parameters' = {parameters!r}: needs '{prefix}.lora_rank' > 0 (expert "
                      "adapters are LoRA adapters)")
    names = [targets] if isinstance(targets, str) else targets
    if not (targets == "all-linear" or (isinstance(names, (list, tuple)) and (names or experts)
                                        and all(n in LINEAR_TARGETS for n in names))):
        errors.append(f"'{prefix}.target_modules' = {targets!r}: use 'all-linear' or a list of "
                      f"{', '.join(LINEAR_TARGETS)}, non-empty unless '{prefix}.target_parameters' names experts")
    return errors


def lora_settings(model_cfg, prefix: str = "actor_rollout_ref.model") -> LoraSettings | None:
    """The LoRA settings of a typed model section (the actor's ModelConfig: lora_rank, lora_alpha, target_modules,
    target_parameters; the critic's and SFT's have no expert targets), or None when `lora_rank` is 0 (full
    fine-tuning). Errors name the keys under `prefix`, the section's path."""
    rank, alpha, targets = model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules
    parameters = getattr(model_cfg, "target_parameters", None)
    targets = targets if isinstance(targets, str) else list(targets)
    parameters = None if parameters is None else list(parameters)
    errors = check_lora_keys(rank, alpha, targets, parameters, prefix)
    if errors:
        raise ValueError("; ".join(errors))
    if rank == 0:
        return None
    exclude = getattr(model_cfg, "exclude_modules", None)
    return LoraSettings(int(rank), float(alpha), targets if isinstance(targets, str) else tuple(targets),
                        tuple(parameters or ()), getattr(model_cfg, "lora_adapter_path", None),
                        exclude if exclude is None or isinstance(exclude, str) else tuple(exclude))


def apply_lora(model: torch.nn.Module, settings: LoraSettings, adapter_dtype: torch.dtype | None = None
               ) -> torch.nn.Module:
    """Inject the adapters into `model` (in place, before FSDP) on the decoder linears `settings.target_modules`
    names ('all-linear': LINEAR_TARGETS; an MoE layer's router is never targeted) and on the expert tensors
    `settings.target_parameters` names (peft's ParamWrapper); base weights are frozen and keep the dtype the model
    was loaded in. The adapters are stored in `adapter_dtype` (None: the base's dtype, or fp32 where peft
    upcasts a half-precision base's adapters). Dropout is 0 so that log-probs are deterministic (the old
    log-probs and the update's must agree). The linears compute through `lora_linear.lora_linear` (one GEMM
    accumulates the scaled adapter product into the base output) wherever that is the same function."""
    from peft import LoraConfig, inject_adapter_in_model

    linears = _linear_targets(model, settings.target_modules)
    experts = _expert_targets(model, settings.target_parameters)
    # target_modules=[] when only experts are targeted: None would be peft's default linears of the model type
    exclude = settings.exclude_modules
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0, bias="none",
                        target_modules=linears, target_parameters=experts or None,
                        exclude_modules=exclude if exclude is None or isinstance(exclude, str) else list(exclude))
    with _targets_as_given():
        model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    use_fused_forward(_lora_layers(model).values())
    if adapter_dtype is not None:
        for layer in _lora_layers(model).values():
            layer.lora_A.to(adapter_dtype)
            layer.lora_B.to(adapter_dtype)
    model.hybridrl_lora = settings   # read by checkpoints (merge needs the scaling)
    return model


def load_adapter_weights(model: torch.nn.Module, adapter_dir: str) -> None:
    """Copy a peft adapter directory's weights (`base_model.model.<x>.lora_A.weight`, as peft's save_pretrained and
    `hybridrl merge` write them) into the adapters `apply_lora` injected (`<x>.lora_A.default.weight`), cast to
    their dtype. Every adapter of the model must be in the file and every tensor of the file must be an adapter of
    the model, with the same shape; otherwise a ValueError names the directory and the keys."""
    import os

    from peft.utils import load_peft_weights

    saved = load_peft_weights(os.path.expanduser(adapter_dir), device="cpu")   # its safetensors or .bin file
    ours = {name: p for name, p in model.named_parameters() if _LORA_PARAM.search(name)}
    wanted = {}
    for key, value in saved.items():
        m = re.fullmatch(r"base_model\.model\.(.+)\.lora_(A|B)\.weight", key)
        wanted[f"{m.group(1)}.lora_{m.group(2)}.{ADAPTER}.weight" if m else key] = value
    missing, unknown = sorted(set(ours) - set(wanted)), sorted(set(wanted) - set(ours))
    wrong = sorted(k for k in set(ours) & set(wanted) if ours[k].shape != wanted[k].shape)
    if missing or unknown or wrong:
        found = {"missing from the file": missing, "not adapters of the model": unknown, "of another shape": wrong}
        detail = "; ".join(f"{what}: {keys[:3]}{' ...' if len(keys) > 3 else ''} ({len(keys)})"
                           for what, keys in found.items() if keys)
        raise ValueError(f"actor_rollout_ref.model.lora_adapter_path={adapter_dir!r}: its adapters do not fit the "
                         f"model's ({detail}); was it trained on this base model with these targets?")
    with torch.no_grad():
        for name, param in ours.items():
            param.copy_(wanted[name].to(param.dtype))


@contextmanager
def _targets_as_given():
    """Inside: peft injects into exactly the targets it is given. On transformers >= 5 peft otherwise rewrites, for
    MoE model types, the transformers-4 expert names gate_proj / up_proj / down_proj among target_modules into
    target_parameters on the fused experts (gate_up at twice the rank), to load adapters trained on the old per-expert
    linears: on a model with dense MLP layers too (Qwen3-MoE's mlp_only_layers) that would move the dense layers'
    adapters onto the experts unasked. Our targets are already in transformers 5's terms."""
    try:
        from peft.utils import transformers_weight_conversion as conversion
    except ImportError:   # a peft without the conversion
        yield
        return
    convert = conversion.convert_peft_config_for_transformers
    conversion.convert_peft_config_for_transformers = lambda *args, **kwargs: None
    try:
        yield
    finally:
        conversion.convert_peft_config_for_transformers = convert


def _linear_targets(model: torch.nn.Module, target_modules) -> list[str]:
    """The target names that are nn.Linear modules of `model`. 'all-linear' means LINEAR_TARGETS, not peft's
    every-nn.Linear: peft would also wrap an MoE router, which neither the plan's counts nor the engine's merge
    handle; an explicit name that is not a linear of this model (an MoE model's expert projections, which are
    3-D tensors: `target_parameters`) is refused."""
    linears = {name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    names = lora_target_names(target_modules)
    if target_modules == "all-linear":
        return [n for n in names if n in linears]
    missing = [n for n in names if n not in linears]
    if missing:
        raise ValueError(f"'actor_rollout_ref.model.target_modules' = {list(names)}: {missing} are not linear layers "
                         f"of this model (its linears: {sorted(linears)}); a mixture-of-experts model's experts are "
                         f"3-D tensors: name them in 'actor_rollout_ref.model.target_parameters' ({EXPERT_TARGETS})")
    return names


def _expert_targets(model: torch.nn.Module, target_parameters) -> list[str]:
    """`target_parameters` as peft gets them, each checked to name a 3-D parameter of this model (peft matches a
    name against the end of a parameter's name)."""
    names = list(target_parameters)
    experts = [n for n, p in model.named_parameters() if p.dim() == 3]
    missing = [t for t in names if not any(n.endswith(f".{t}") for n in experts)]
    if missing:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise ValueError(f"'actor_rollout_ref.model.target_parameters' = {names}: {missing} match no 3-D expert "
                         f"tensor of this model (model_type {model_type!r}); expert adapters need a "
                         "mixture-of-experts model with fused experts (Qwen3-MoE, Mixtral)")
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


def _expert_factors(a: torch.Tensor, b: torch.Tensor, experts: int, out_first: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(lhs, rhs) with expert e's update = lhs[e] @ rhs[e] (unscaled), from peft's ParamWrapper factors a
    [E·r, in] and b [out, r·E] (peft's `get_delta_factors`): [E, out, r] @ [E, r, in] for the transformers-5 layout
    [E, out, in] (`out_first`), else the transposes for a [E, in, out] tensor."""
    a_Eri = a.reshape(experts, -1, a.shape[-1])
    b_Eor = b.reshape(b.shape[0], -1, experts).permute(2, 0, 1)
    return (b_Eor, a_Eri) if out_first else (a_Eri.transpose(-2, -1), b_Eor.transpose(-2, -1))


def _merged_experts(w: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor, scaling: float) -> torch.Tensor:
    """w [El, ..] + scaling·lhs·rhs per expert, summed in fp32, returned in fp32."""
    return torch.baddbmm(w.float(), lhs.float(), rhs.float(), alpha=scaling)


def _first_row(p: torch.Tensor) -> int:
    """The global index of this rank's first row of `p` (FSDP2 shards dim 0 with torch.chunk semantics over the
    last mesh dim); 0 for a whole tensor."""
    if not isinstance(p, DTensor):
        return 0
    mesh = p.device_mesh
    size, rank = mesh.size(mesh.ndim - 1), mesh.get_local_rank(mesh.ndim - 1)
    return min(p.shape[0], rank * -(-p.shape[0] // size))


class ExpertMerge:
    """W_rows -> W_rows + scaling·B_e·A_e for this rank's experts of a ParamWrapper-adapted expert tensor (called
    like a linear's merge function). FSDP shards W by experts but the factors by their own rows, which do not line
    up with W's: both factors are gathered whole (E·r·(in + out) elements) and the rank's experts taken from them.
    `factors()` gives the same factors unmerged, for an engine that computes the update beside a borrowed W."""

    def __init__(self, layer, param: torch.Tensor):
        self.layer, self.first = layer, _first_row(param)
        self.scaling, self.rank = layer.scaling[ADAPTER], layer.r[ADAPTER]

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lhs [E, out, r], rhs [E, r, in]) whole, in their stored dtype: expert e's update is
        scaling·lhs[e]·rhs[e] in the layout of the adapted tensor."""
        a, b = (t.full_tensor() if isinstance(t, DTensor) else t
                for t in (self.layer.lora_A[ADAPTER].weight, self.layer.lora_B[ADAPTER].weight))
        return _expert_factors(a.detach(), b.detach(), self.layer.num_experts, self.layer._did_swap_in_out_features)

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        lhs, rhs = self.factors()
        rows = slice(self.first, self.first + w.shape[0])
        return _merged_experts(w, lhs[rows], rhs[rows], self.scaling)


def _hf_name(name: str) -> str:
    """A parameter's HF name: its peft name without the `base_layer` levels (nested for several expert targets)."""
    return ".".join(part for part in name.split(".") if part != "base_layer")


def engine_parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor, object]]:
    """(HF name, parameter, merge or None) for every weight the rollout engine loads. Without adapters: the
    module's parameters as they are. With adapters: adapter tensors are skipped, `x.base_layer.weight` is named
    `x.weight` (an expert tensor `experts[.base_layer..].gate_up_proj` is named `experts.gate_up_proj`) and a
    targeted one comes with the function that merges this rank's rows of it (an `ExpertMerge` for expert tensors,
    which also gives the factors unmerged)."""
    layers = _lora_layers(module)
    if not layers:
        yield from ((name, p, None) for name, p in module.named_parameters())
        return
    from peft.tuners.lora.layer import ParamWrapper

    linears = {name: m for name, m in layers.items() if not isinstance(m, ParamWrapper)}
    experts = {f"{_hf_name(name)}.{m.parameter_name}": m for name, m in layers.items() if isinstance(m, ParamWrapper)}
    for name, p in module.named_parameters():
        if _LORA_PARAM.search(name):
            continue
        hf = _hf_name(name)
        owner, _, leaf = hf.rpartition(".")
        if hf in experts:
            yield hf, p, ExpertMerge(experts[hf], p)
        elif owner in linears and leaf == "weight":
            yield hf, p, _merge_fn(linears[owner])
        else:
            yield hf, p, None


def merge_lora_state(state: Mapping[str, torch.Tensor], scaling: float, target_parameters=()) -> tuple[dict, dict]:
    """A module state dict with adapters -> (merged HF state dict, peft adapter state dict). `target_parameters`:
    the run's expert targets (LoraSettings.target_parameters), which say which adapter wraps which expert tensor.

    Merged: `x.weight` = base + scaling·B·A (an expert tensor: + scaling·B_e·A_e per expert), summed in fp32 and
    kept in the wider of the base's and the adapters' dtypes (a bf16 base with fp32 adapters gives fp32: the update
    is not rounded to bf16 here). Adapter keys follow peft's saved format (`base_model.model.<x>.lora_A.weight`), which
    `PeftModel.from_pretrained` loads onto the base model."""
    wrappers = _expert_wrappers(state, target_parameters)
    merged, adapter = {}, {}
    for key, value in state.items():
        m = _LORA_PARAM.search(key)
        if m:
            adapter[f"base_model.model.{key[:m.start()]}.lora_{m.group(1)}.weight"] = value
            continue
        owner, _, leaf = key.rpartition(".base_layer.")
        if key in wrappers:
            a, b = state[f"{wrappers[key]}.lora_A.{ADAPTER}.weight"], state[f"{wrappers[key]}.lora_B.{ADAPTER}.weight"]
            lhs, rhs = _expert_factors(a, b, value.shape[0])
            value = _merged_experts(value, lhs, rhs, scaling).to(torch.promote_types(value.dtype, b.dtype))
        elif owner and leaf == "weight" and f"{owner}.lora_A.{ADAPTER}.weight" in state:
            a, b = state[f"{owner}.lora_A.{ADAPTER}.weight"], state[f"{owner}.lora_B.{ADAPTER}.weight"]
            value = _merged(value, b, a, scaling).to(torch.promote_types(value.dtype, b.dtype))
        merged[_hf_name(key)] = value
    return merged, adapter


def _expert_wrappers(state: Mapping[str, torch.Tensor], target_parameters) -> dict[str, str]:
    """State-dict key of each adapted expert tensor -> the key prefix of its adapter. peft nests one ParamWrapper
    per targeted tensor of a module in the module's parameter order (the first innermost), so of n targeted tensors
    under `m.base_layer`×n the i-th (0-based) is wrapped at `m` + `.base_layer`×(n-1-i)."""
    by_module: dict[str, list[str]] = {}
    for key in state:
        hf = _hf_name(key)
        if "." in hf and any(hf.endswith(f".{t}") for t in target_parameters):
            by_module.setdefault(key.partition(".base_layer.")[0], []).append(key)
    return {key: module + ".base_layer" * (len(keys) - 1 - i)
            for module, keys in by_module.items() for i, key in enumerate(keys)}


def adapter_param_count(shape, rank: int, target_modules, target_parameters=()) -> int:
    """Adapter parameters of a decoder of this `ModelShape` (plan/model_shape.py): rank·(in + out) per targeted
    linear, and per targeted expert tensor of each MoE layer rank·(in + out) per expert (peft's lora_A [E·r, in],
    lora_B [out, r·E])."""
    if not rank:
        return 0
    q, kv, h, i = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    # MoE layers have no dense MLP linears (their experts are 3-D tensors: target_parameters)
    layers = {n: shape.dense_layers if n in ("gate_proj", "up_proj", "down_proj") else shape.layers for n in dims}
    ie = shape.expert_intermediate
    expert_dims = {"experts.gate_up_proj": (h, 2 * ie), "experts.down_proj": (ie, h)}
    return (sum(layers[n] * rank * sum(dims[n]) for n in lora_target_names(target_modules))
            + sum(shape.moe_layers * shape.experts * rank * sum(expert_dims[n]) for n in target_parameters or ()))


def lora_target_names(target_modules) -> list[str]:
    """The decoder linears a `target_modules` value names ('all-linear': every one of LINEAR_TARGETS)."""
    return list(LINEAR_TARGETS) if target_modules == "all-linear" else [target_modules] if isinstance(
        target_modules, str) else list(target_modules)
