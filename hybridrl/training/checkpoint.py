"""Sharded checkpoints of an FSDP2 model, its optimizer, lr scheduler and RNG states, into a GIVEN directory.

Layout of `ckpt_dir` (the trainer's checkpoint manager owns temp-dir + rename and retention):
  model/                         torch.distributed.checkpoint (DCP) of the model state dict (HF names, sharded)
  optim/                         DCP of the optimizer state dict (keyed by parameter FQN)
  extra_state_world_size_{W}_rank_{r}.pt   lr scheduler state, RNG states (python, numpy, torch, cuda), extras
  huggingface/                   HF config (+ generation config) and tokenizer files
  hybridrl_checkpoint.json       role (actor / critic), world size, master dtype, LoRA settings: what `merge` needs

Choices: DCP through `get/set_model_state_dict` and `get/set_optimizer_state_dict` writes each rank's shard in
parallel and reshards on load, so a checkpoint taken on W ranks loads on any other count (model and
optimizer; the RNG states then come from rank 0's file of the old run and the count is reported). The model
state dict is saved flat (no "model." prefix) so `merge.py` reads it with the HF names directly. With LoRA it
holds the frozen base weights under peft's names (`x.base_layer.weight`) and the adapters, so a resume is exact.

On load, the optimizer hyperparameters of the run doing the loading (lr, betas, weight decay, eps; the
scheduler's base lrs) replace the saved ones: the saved optimizer state (moments, step counts) and scheduler
position are kept, but a user who resumes with a new `optim.lr` gets it, with the changes logged. A file that
fails to load is named in the error (truncated, corrupt, or not a checkpoint).
"""

from __future__ import annotations

import json
import logging
import random
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

__all__ = ["save_checkpoint", "load_checkpoint", "save_hf_model", "saved_contents", "CHECKPOINT_META",
           "CheckpointLoadError"]

logger = logging.getLogger("hybridrl.checkpoint")

CHECKPOINT_META = "hybridrl_checkpoint.json"
FRESH_OPTIMIZER = "FRESH"   # in optim/: the optimizer had taken no step when the checkpoint was saved
_CONTENTS = ("model", "optimizer", "extra", "hf_model")
_OPTIM_SETTINGS = ("initial_lr", "betas", "weight_decay", "eps")  # what the config sets per param group, besides lr


class CheckpointLoadError(RuntimeError):
    """A checkpoint file or directory that exists but cannot be read back."""


def _loading(what: str, path: Path, fn):
    """fn(), with any failure to read `path` re-raised as a CheckpointLoadError naming it."""
    try:
        return fn()
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        causes = [exc for exc, _ in e.failures.values()] if isinstance(e, CheckpointException) else [e]
        why = "; ".join(f"{type(c).__name__}: {str(c).strip()[:300]}".rstrip(": ") for c in causes)
        raise CheckpointLoadError(f"checkpoint {path.parent}: cannot load the {what} from {path} ({why}); the file "
                                  "is truncated, corrupt or not part of a hybridrl checkpoint") from e


def _configured_optim(optimizer, lr_scheduler) -> tuple[list[dict], list[float] | None]:
    groups = [{k: g[k] for k in ("lr", *_OPTIM_SETTINGS) if k in g} for g in optimizer.param_groups]
    return groups, (list(lr_scheduler.base_lrs) if lr_scheduler is not None else None)


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def _reapply_configured_optim(optimizer, lr_scheduler, configured, ckpt_dir: Path) -> list[str]:
    """Put this run's optimizer settings back over the loaded ones; the lr is recomputed from the configured base lr
    at the loaded scheduler position. Returns the changes, one line each."""
    groups, base_lrs = configured
    changes = []
    for i, (group, want) in enumerate(zip(optimizer.param_groups, groups)):
        for key in _OPTIM_SETTINGS:
            if key in want and _plain(group.get(key)) != _plain(want[key]):
                changes.append(f"param_groups[{i}].{key}: {group.get(key)} -> {want[key]}")
                group[key] = want[key]
    if lr_scheduler is not None and hasattr(lr_scheduler, "lr_lambdas"):
        lr_scheduler.base_lrs = list(base_lrs)
        lrs = [b * fn(lr_scheduler.last_epoch) for b, fn in zip(base_lrs, lr_scheduler.lr_lambdas)]
        lr_scheduler._last_lr = list(lrs)
    else:
        lrs = [g["lr"] for g in groups]
    for i, (group, lr) in enumerate(zip(optimizer.param_groups, lrs)):
        if group["lr"] != lr:
            changes.append(f"param_groups[{i}].lr: {group['lr']:.6g} -> {lr:.6g}")
            group["lr"] = lr
    if changes and _rank_world()[0] == 0:
        logger.warning("checkpoint %s: this run's optimizer settings replace the saved ones: %s", ckpt_dir,
                       "; ".join(changes))
    return changes


def _rank_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier():
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _check_contents(contents) -> set[str]:
    bad = [c for c in contents if c not in _CONTENTS]
    if bad:
        raise ValueError(f"checkpoint.contents has {bad}; allowed: {list(_CONTENTS)}")
    return set(contents)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(ckpt_dir, module, optimizer=None, lr_scheduler=None, *, hf_config=None, tokenizer=None,
                    role: str = "actor", contents=("model", "optimizer", "extra"), extra: dict | None = None) -> Path:
    """Collective: every rank of the module's mesh calls it with the same directory."""
    contents = _check_contents(contents)
    ckpt_dir = Path(ckpt_dir)
    rank, world = _rank_world()
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    _barrier()
    if "model" in contents:
        dcp.save(get_model_state_dict(module), checkpoint_id=str(ckpt_dir / "model"))
    if "optimizer" in contents:
        if optimizer is None:
            raise ValueError("checkpoint.contents has 'optimizer' but no optimizer was given")
        # before the first optimizer step (partial rollouts' first steps, critic warm-up) the state is empty, and
        # torch fills it for the state dict with a step at lr 0 (step = 1, zero moments): left in place that step
        # would shift AdamW's bias correction for the rest of the run, so a saving run would train differently
        fresh = not optimizer.state
        dcp.save(get_optimizer_state_dict(module, optimizer), checkpoint_id=str(ckpt_dir / "optim"))
        if fresh:
            optimizer.state.clear()
            if rank == 0:
                (ckpt_dir / "optim" / FRESH_OPTIMIZER).write_text("no optimizer step before this checkpoint\n")
    if "extra" in contents:
        state = {"lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
                 "rng": _rng_state(), "extra": extra or {}}
        torch.save(state, ckpt_dir / f"extra_state_world_size_{world}_rank_{rank}.pt")
    if rank == 0:
        hf_config = hf_config if hf_config is not None else getattr(module, "config", None)
        if hf_config is not None:
            hf_config.save_pretrained(ckpt_dir / "huggingface")
        if tokenizer is not None:
            tokenizer.save_pretrained(ckpt_dir / "huggingface")
        # the trained parameters' dtype (LoRA: the adapters'; the frozen base may be stored narrower)
        params = list(module.parameters())
        master = next((p for p in params if p.requires_grad), params[0]).dtype
        meta = {"role": role, "world_size": world, "master_dtype": str(master).replace("torch.", ""),
                "contents": sorted(contents)}
        if getattr(module, "hybridrl_lora", None) is not None:   # merge needs the adapters' scaling
            meta["lora"] = module.hybridrl_lora.to_json()
        (ckpt_dir / CHECKPOINT_META).write_text(json.dumps(meta, indent=2))
    if "hf_model" in contents:
        save_hf_model(module, ckpt_dir / "huggingface", hf_config=hf_config, tokenizer=tokenizer, role=role)
    _barrier()
    return ckpt_dir


def saved_contents(ckpt_dir) -> set[str] | None:
    """What the checkpoint of one role in `ckpt_dir` was saved with (None: no metadata file)."""
    meta = Path(ckpt_dir) / CHECKPOINT_META
    return set(json.loads(meta.read_text())["contents"]) if meta.is_file() else None


def load_checkpoint(ckpt_dir, module, optimizer=None, lr_scheduler=None, *,
                    contents=("model", "optimizer", "extra")) -> dict:
    """Collective. Restores what `contents` names; returns the saved `extra` dict ({} if none)."""
    contents = _check_contents(contents) - {"hf_model"}
    ckpt_dir = Path(ckpt_dir)
    needed = {"model": ckpt_dir / "model", "optimizer": ckpt_dir / "optim"}
    for what, path in needed.items():
        if what in contents and not path.is_dir():
            raise FileNotFoundError(f"checkpoint {ckpt_dir}: '{what}' requested but {path} does not exist")
    configured = _configured_optim(optimizer, lr_scheduler) if optimizer is not None else None
    if "model" in contents:
        sd = get_model_state_dict(module)
        _loading("model", ckpt_dir / "model", lambda: dcp.load(sd, checkpoint_id=str(ckpt_dir / "model")))
        set_model_state_dict(module, sd)
    if "optimizer" in contents:
        if optimizer is None:
            raise ValueError("load_checkpoint: contents has 'optimizer' but no optimizer was given")
        osd = get_optimizer_state_dict(module, optimizer)
        _loading("optimizer", ckpt_dir / "optim", lambda: dcp.load(osd, checkpoint_id=str(ckpt_dir / "optim")))
        set_optimizer_state_dict(module, optimizer, osd)
        if (ckpt_dir / "optim" / FRESH_OPTIMIZER).exists():   # saved before any step: resume with none, too
            optimizer.state.clear()
    extra = _load_extra(ckpt_dir, lr_scheduler) if "extra" in contents else {}
    if configured is not None:
        _reapply_configured_optim(optimizer, lr_scheduler, configured, ckpt_dir)
    return extra


def _load_extra(ckpt_dir: Path, lr_scheduler) -> dict:
    rank, world = _rank_world()
    path = ckpt_dir / f"extra_state_world_size_{world}_rank_{rank}.pt"
    same_layout = path.exists()
    if not same_layout:
        others = sorted(ckpt_dir.glob("extra_state_world_size_*_rank_0.pt"))
        if not others:
            raise FileNotFoundError(f"checkpoint {ckpt_dir}: no extra_state_world_size_*_rank_*.pt file")
        path = others[0]
        warnings.warn(f"checkpoint {ckpt_dir} was saved with another world size; scheduler state taken from "
                      f"{path.name}, RNG states not restored", stacklevel=3)
    state = _loading("scheduler and RNG states", path, lambda: torch.load(path, map_location="cpu", weights_only=False))
    if lr_scheduler is not None and state.get("lr_scheduler") is not None:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    if same_layout:
        _set_rng_state(state["rng"])
    return state.get("extra", {})


def save_hf_model(module, out_dir, *, hf_config=None, tokenizer=None, role: str = "actor",
                  dtype=torch.bfloat16) -> Path:
    """Collective: gather the full state dict (to CPU) and let rank 0 write a `from_pretrained` directory."""
    from hybridrl.training.hf_export import write_hf_model

    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    rank, _ = _rank_world()
    out_dir = Path(out_dir)
    if rank == 0:
        lora = getattr(module, "hybridrl_lora", None)
        if lora is not None:   # the HF directory holds the merged weights
            from hybridrl.training.lora import merge_lora_state

            full = merge_lora_state(full, lora.scaling, lora.target_parameters)[0]
        cfg = hf_config if hf_config is not None else module.config
        write_hf_model(full, cfg, role, out_dir, dtype=dtype, tokenizer=tokenizer)
    _barrier()
    return out_dir

