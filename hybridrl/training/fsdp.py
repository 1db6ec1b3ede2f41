"""FSDP2 wrapping of plain HF models: device mesh, per-block `fully_shard`, model init from a HF path.

Choices:
- Mesh: 1-D `('fsdp',)` over all ranks, or 2-D HSDP `('ddp','fsdp')` when 0 < fsdp_size < world size
  (`fully_shard` replicates over `ddp` and shards over `fsdp`).
- Wrapping follows torchtitan: `fully_shard` on every decoder block (the classes HF lists in
  `_no_split_modules`), then on the root (embeddings, final norm, head). MixedPrecisionPolicy casts params to
  `param_dtype` for compute and reduces grads in `reduce_dtype` (at one rank, in the master dtype: nothing is
  reduced there); master weights stay in the load dtype (fp32).
- Init: rank 0 reads the HF checkpoint on CPU; the other ranks build the same model on the meta device (no
  memory). After sharding, `set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)` streams the
  weights from rank 0 into every rank's shard, and buffers (rotary inv_freq, not in the state dict) are
  broadcast too. So host memory holds one full copy per machine-rank-0 instead of one per GPU, and randomly
  initialised heads (the critic's value head) are identical on all ranks.
- No-grad passes in several micro-batches (log-probs, values) may keep every block unsharded for the whole
  pass (`keep_unsharded`): one all-gather per block per pass instead of one per block per micro-batch, for
  the memory of one full `param_dtype` copy of the model while the pass runs (`unsharded_param_bytes`).
- Critic = `AutoModelForTokenClassification(num_labels=1)` (HF backbone + linear score head) with
  classifier dropout forced to 0, so values are deterministic. Reward model = the checkpoint's own
  `AutoModelForSequenceClassification`, which must have num_labels=1 (training/reward_model.py scores with it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from hybridrl.training.moe import load_kwargs

__all__ = ["ModelSource", "FSDPDtypes", "set_recompute", "recompute_on", "recomputed_layers", "build_training_mesh", "apply_fsdp", "decoder_blocks",
           "load_hf_model", "build_fsdp_model", "resolve_dtype", "keep_unsharded", "should_keep_unsharded", "unsharded_param_bytes",
           "grads_unsplit"]

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSource:
    """The HF model `build_fsdp_model` loads: its directory, the keys merged into its HF config and
    from_pretrained's trust_remote_code."""

    path: str
    override_config: Mapping
    trust_remote_code: bool

    @classmethod
    def of(cls, model_section) -> ModelSource:
        """From a typed model section with `path`, `override_config` and `trust_remote_code` (the actor's, the
        critic's, the reward model's)."""
        return cls(model_section.path, dict(model_section.override_config), model_section.trust_remote_code)


@dataclass(frozen=True)
class FSDPDtypes:
    """The dtypes of an FSDP-sharded model: `model` of the master weights, `param` of forward/backward compute and
    `reduce` of the gradient reduction (MixedPrecisionPolicy; on CPU both are fp32)."""

    model: str | torch.dtype
    param: str | torch.dtype
    reduce: str | torch.dtype

    @classmethod
    def of(cls, fsdp_section) -> FSDPDtypes:
        """From a typed fsdp_config section with `model_dtype` and `mixed_precision` (the actor's, SFT's)."""
        mp = fsdp_section.mixed_precision
        return cls(fsdp_section.model_dtype, mp.param_dtype, mp.reduce_dtype)


def resolve_dtype(name, key: str = "dtype") -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"{key}={name!r} is not a dtype; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def build_training_mesh(world_size: int, fsdp_size: int = -1, device_type: str = "cuda") -> DeviceMesh:
    if fsdp_size == 0 or fsdp_size < -1:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size}: use -1 (all ranks) or a positive divisor of "
                         f"the world size {world_size}")
    if fsdp_size == -1 or fsdp_size >= world_size:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("fsdp",))
    if world_size % fsdp_size:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide the world size {world_size}")
    return init_device_mesh(device_type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    # by the HF class anywhere in the MRO: once sharded, a block's class is FSDP2's subclass of it
    blocks = [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no decoder blocks found (its _no_split_modules is "
                         f"{sorted(names)}); FSDP needs per-block wrapping")
    return blocks


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
               reshard_after_forward: bool = True) -> torch.nn.Module:
    reduce_dtype = resolve_dtype(reduce_dtype, "mixed_precision.reduce_dtype")
    trained_dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if mesh.size() == 1 and len(trained_dtypes) == 1:
        # one rank reduces nothing, and FSDP casts each backward's gradients to the master dtype before adding
        # them up: reducing in the master dtype is the same arithmetic, and lets a mini-batch's unreduced
        # gradients (which FSDP accumulates in reduce_dtype) take no more memory than the reduced ones
        reduce_dtype = trained_dtypes.pop()
    mp = MixedPrecisionPolicy(param_dtype=resolve_dtype(param_dtype, "mixed_precision.param_dtype"),
                              reduce_dtype=reduce_dtype)
    for block in decoder_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    # what keep_unsharded restores, and what it costs (the unsharded copy is in the compute dtype)
    model.fsdp_reshard_after_forward = reshard_after_forward
    model.fsdp_unsharded_bytes = sum(p.numel() for p in model.parameters()) * mp.param_dtype.itemsize
    model.fsdp_mixed_precision = mp   # the dtype unreduced gradients accumulate in (grads_unsplit)
    return model


def unsharded_param_bytes(model: torch.nn.Module) -> int | None:
    """Bytes of the model's parameters all-gathered in the compute dtype; None if FSDP was not applied here."""
    return getattr(model, "fsdp_unsharded_bytes", None)


def grads_unsplit(model: torch.nn.Module) -> bool:
    """True when deferring the gradient reduction to a mini-batch's last micro-batch costs no memory: FSDP
    shards `model` over one rank (one GPU, or replication only), so each rank's gradients are full size whether
    reduced or not, and unreduced gradients accumulate in a dtype no wider than the master weights' (FSDP keeps
    them in reduce_dtype where it differs from param_dtype: fp32 with bf16 masters would double them). It saves
    a reduce-scatter per micro-batch (at one rank: copies in and out of its buffer, and an add)."""
    if not isinstance(model, FSDPModule):
        return False
    trained = [p for p in model.parameters() if isinstance(p, DTensor) and p.requires_grad]  # LoRA: adapters only
    if not trained or any(trained[0].device_mesh.size(dim) > 1
                          for dim, placement in enumerate(trained[0].placements) if placement.is_shard()):
        return False
    mp = getattr(model, "fsdp_mixed_precision", None) or MixedPrecisionPolicy()

    def accumulated(p):
        compute = mp.param_dtype or p.dtype
        return mp.reduce_dtype if mp.reduce_dtype not in (None, compute) else compute

    return all(accumulated(p).itemsize <= p.dtype.itemsize for p in trained)


# `auto` keeps a no-grad pass unsharded when the full compute-dtype model takes at most this share of the
# device's memory (7B bf16 on an 80 GB GPU: 19% -> yes; 32B: 80% -> no)
AUTO_UNSHARD_MAX_FRACTION = 0.25


def should_keep_unsharded(model: torch.nn.Module, mode, num_micro_batches: int, device: torch.device) -> bool:
    """mode: True / False / "auto" (config `*.log_prob_unshard_once`, `critic.forward_unshard_once`); never for a
    single micro-batch."""
    size = unsharded_param_bytes(model)
    if num_micro_batches < 2 or size is None or mode is False:
        return False
    if mode is True:
        return True
    if mode != "auto":
        raise ValueError(f"unshard_once={mode!r} (config: *.log_prob_unshard_once, critic.forward_unshard_once) "
                         "must be true, false or 'auto'")
    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return size <= AUTO_UNSHARD_MAX_FRACTION * total


@contextmanager
def keep_unsharded(model: torch.nn.Module, enabled: bool = True, backward: bool = False):
    """Inside: blocks stay unsharded after their forward (and, with `backward`, after their backward), so later
    micro-batches skip the all-gathers: a no-grad pass, or one mini-batch of an update (its optimizer step must
    come after the exit, which drops the unsharded copies it would leave stale). On exit every FSDP module is
    resharded and gets its settings back, so nothing unsharded outlives the pass (the hybrid engine's memory order
    relies on it)."""
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)] if enabled else []
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        if backward:
            m.set_reshard_after_backward(False, recurse=False)
    try:
        yield
    finally:
        restore = getattr(model, "fsdp_reshard_after_forward", True)
        for m in modules:
            m.set_reshard_after_forward(restore, recurse=False)
            if backward:
                m.set_reshard_after_backward(True, recurse=False)
            m.reshard()


def _model_class(role: str):
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    if role == "critic":
        return AutoModelForTokenClassification
    if role == "reward_model":
        return AutoModelForSequenceClassification
    if role in ("actor", "ref", "causal_lm"):
        return AutoModelForCausalLM
    raise ValueError(f"model role={role!r}: use actor, ref, causal_lm, critic or reward_model")


def value_head(model: torch.nn.Module) -> torch.nn.Module:
    """The critic's linear value head (transformers' token classifiers name it `score`, some `classifier`)."""
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    raise ValueError(f"{type(model).__name__} has no value head named score or classifier")


def load_hf_config(path: str, role: str = "actor", override_config: Mapping | None = None,
                   trust_remote_code: bool = False):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for k, v in dict(override_config or {}).items():
        setattr(cfg, k, v)
    if role == "critic":
        cfg.num_labels = 1
        cfg.classifier_dropout = 0.0
    if role == "reward_model":
        if cfg.num_labels != 1:
            raise ValueError(f"reward_model.model.path={path!r} has num_labels={cfg.num_labels}; a reward model gives "
                             "one score per sequence (num_labels=1)")
        if cfg.pad_token_id is None:  # HF's pooling refuses batches without one; ours reads the attention mask
            cfg.pad_token_id = 0
    return cfg


def load_hf_model(path: str, role: str = "actor", dtype=torch.float32, override_config: Mapping | None = None,
                  trust_remote_code: bool = False, on_meta: bool = False) -> torch.nn.Module:
    """The plain HF model, on CPU with weights (on_meta=False) or as an empty meta-device skeleton; an MoE model's
    experts run as grouped GEMMs (training/moe.py)."""
    cls = _model_class(role)
    cfg = load_hf_config(path, role, override_config, trust_remote_code)
    dtype = resolve_dtype(dtype, "fsdp_config.model_dtype")
    kwargs = dict(dtype=dtype, trust_remote_code=trust_remote_code, **load_kwargs(cfg))  # MoE: grouped-GEMM experts
    if on_meta:
        with torch.device("meta"):
            return cls.from_config(cfg, **kwargs)
    return cls.from_pretrained(path, config=cfg, **kwargs)


def set_recompute(model, on: bool, kept_layers: int = 0) -> None:
    """Gradient (activation) checkpointing of an HF model's decoder layers on or off, non-reentrant; through
    transformers' `activation_checkpointing_*` where it has them (its `gradient_checkpointing_*` names are
    deprecated aliases there). With `on`, the last `kept_layers` decoder blocks keep their activations instead
    (transformers checkpoints each block by its own `gradient_checkpointing` flag)."""
    kwargs = {"use_reentrant": False}
    current = hasattr(model, "activation_checkpointing_enable")
    if not on:
        (model.activation_checkpointing_disable if current else model.gradient_checkpointing_disable)()
        return
    if current:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    blocks = decoder_blocks(model)
    if not 0 <= kept_layers < len(blocks):
        raise ValueError(f"set_recompute: kept_layers={kept_layers} of {len(blocks)} decoder layers")
    for block in blocks[len(blocks) - kept_layers:]:
        block.gradient_checkpointing = False


def recomputed_layers(model) -> int:
    """How many decoder blocks recompute their forward in backward."""
    return sum(bool(getattr(b, "gradient_checkpointing", False)) for b in decoder_blocks(model))


def recompute_on(model) -> bool:
    """Whether `set_recompute` is on for an HF model (transformers' current property name where it exists)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)


def build_fsdp_model(source: ModelSource, dtypes: FSDPDtypes, mesh: DeviceMesh, device: torch.device,
                     role: str = "actor", use_varlen_attention: bool = False, lora=None,
                     lora_base_dtype=None, gradient_checkpointing: bool = False, recompute_kept_layers: int = 0,
                     liger: bool = False) -> torch.nn.Module:
    """Load `source.path` and return it sharded on `mesh` in `dtypes`, weights on `device` (see module docstring).
    `use_varlen_attention`: packed forwards (the caller's resolved use_remove_padding).
    `gradient_checkpointing`: recompute each decoder layer in backward but the last `recompute_kept_layers` (the
    caller's resolved choice).
    `liger`: Liger's fused RMSNorm / SwiGLU / RoPE kernels (training/liger.py; the plan's choice).
    `lora` (training/lora.py LoraSettings): adapters injected before sharding, loaded from its `adapter_path` if
    set; rank 0's initial adapters are broadcast with the weights. The frozen base is then loaded in `lora_base_dtype` (None: `dtypes.model`) and
    the adapters kept in `dtypes.model`; FSDP2 all-gathers both in its `param_dtype`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from hybridrl.training.packed_attention import register_varlen_attention

    device = torch.device(device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if not isinstance(source, ModelSource) or not isinstance(dtypes, FSDPDtypes):
        raise TypeError(f"build_fsdp_model: a ModelSource and FSDPDtypes (ModelSource.of / FSDPDtypes.of of the typed "
                        f"sections), got {type(source).__name__} and {type(dtypes).__name__}")
    master = resolve_dtype(dtypes.model, "fsdp_config.model_dtype")
    stored = master if lora is None or lora_base_dtype is None else resolve_dtype(lora_base_dtype, "lora_base_dtype")
    if stored != master and torch.__version__ < (2, 8):   # pytorch#154103
        raise RuntimeError(f"LoRA with the frozen base in {stored} and adapters in fsdp_config.model_dtype={master} "
                           f"needs torch >= 2.8 (FSDP2 mixed frozen/trainable dtypes), this is {torch.__version__}: "
                           "upgrade torch, or set actor_rollout_ref.actor.fsdp_config.model_dtype=bf16")
    model = load_hf_model(source.path, role=role, dtype=stored, override_config=source.override_config,
                          trust_remote_code=source.trust_remote_code, on_meta=rank != 0)
    if liger:
        from hybridrl.training.liger import apply_liger

        apply_liger(model)
    if lora is not None:
        from hybridrl.training.lora import apply_lora

        model = apply_lora(model, lora, adapter_dtype=master)
        if role == "critic":   # the value head is new: it trains whole beside the adapters (peft's TOKEN_CLS)
            value_head(model).requires_grad_(True)
        if lora.adapter_path is not None and rank == 0:   # the others receive them with the weights below
            from hybridrl.training.lora import load_adapter_weights

            load_adapter_weights(model, lora.adapter_path)
    full_state = model.state_dict() if rank == 0 else None
    if use_varlen_attention:
        model.set_attn_implementation(register_varlen_attention())
    if gradient_checkpointing:
        set_recompute(model, True, recompute_kept_layers)
    if device.type == "cpu":
        mp = {"param_dtype": torch.float32, "reduce_dtype": torch.float32}   # CPU kernels: fp32 everywhere
    else:
        mp = {"param_dtype": dtypes.param, "reduce_dtype": dtypes.reduce}
    apply_fsdp(model, mesh, **mp)
    model = model.to(device) if rank == 0 else model.to_empty(device=device)
    set_model_state_dict(model, full_state or {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    if dist.is_initialized():
        for buf in model.buffers():
            dist.broadcast(buf, src=0)
    return model
