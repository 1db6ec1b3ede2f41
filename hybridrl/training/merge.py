"""Merge a sharded checkpoint (checkpoint.py layout) into a HF directory that `from_pretrained` loads.

Choices: runs in one process without torch.distributed (`dcp.load(no_dist=True)` reads every shard). The
model skeleton is built on the meta device from `huggingface/config.json` (no random init, no memory), only
to learn the state-dict keys, shapes and dtypes; the loaded tensors are then assigned into it and written
with `save_pretrained` (safetensors, sharded by HF when large, tied weights handled by HF). Output dtype is
bf16 by default (what inference wants), fp32 on request. Tokenizer and generation-config files are copied.
A LoRA checkpoint (its meta has `lora`) is read in its stored dtypes (a bf16 base, fp32 adapters) and merged
(W + lora_alpha / lora_rank · B·A, per expert for expert adapters, summed in fp32 before the output cast), and its adapters are also written as a peft directory in `out_dir/adapter`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hybridrl.training.checkpoint import CHECKPOINT_META
from hybridrl.training.hf_export import model_skeleton, write_hf_model

__all__ = ["merge_checkpoint", "register"]


def merge_checkpoint(ckpt_dir, out_dir, dtype: str = "bfloat16") -> Path:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from transformers import AutoConfig

    ckpt_dir, out_dir = Path(ckpt_dir), Path(out_dir)
    for need in (ckpt_dir / "model", ckpt_dir / "huggingface" / "config.json", ckpt_dir / CHECKPOINT_META):
        if not need.exists():
            raise FileNotFoundError(f"merge: {need} not found; is {ckpt_dir} a hybridrl checkpoint directory?")
    meta = json.loads((ckpt_dir / CHECKPOINT_META).read_text())
    hf_config = AutoConfig.from_pretrained(ckpt_dir / "huggingface")
    master = getattr(torch, meta.get("master_dtype", "float32"))
    if meta.get("lora"):
        state = _lora_state(ckpt_dir / "model")
    else:
        state = {k: torch.empty(v.shape, dtype=master if v.is_floating_point() else v.dtype)
                 for k, v in model_skeleton(hf_config, meta["role"]).state_dict().items()}
    dcp.load(state, checkpoint_id=str(ckpt_dir / "model"), planner=DefaultLoadPlanner(allow_partial_load=True),
             no_dist=True)
    if meta.get("lora"):
        state = write_lora_adapter(state, meta["lora"], out_dir / "adapter", dtype)
    write_hf_model(state, hf_config, meta["role"], out_dir, dtype=dtype)
    hf_src = ckpt_dir / "huggingface"
    for f in hf_src.iterdir():
        if f.is_file() and not (out_dir / f.name).exists():
            shutil.copy2(f, out_dir / f.name)
    return out_dir


def _lora_state(model_dir: Path) -> dict:
    """Empty tensors for every key of a LoRA checkpoint (base weights under peft's names and the adapters) in
    their stored dtypes, read from the DCP metadata: the plain HF skeleton does not have these keys."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(model_dir)).read_metadata().state_dict_metadata
    return {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in meta.items() if hasattr(v, "size")}


def write_lora_adapter(state: dict, lora: dict, adapter_dir: Path, dtype: str) -> dict:
    """Write the adapters as a peft directory (`PeftModel.from_pretrained(base, adapter_dir)` loads it) and return
    the merged HF state dict (W + lora_alpha / lora_rank · B·A)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from hybridrl.training.fsdp import resolve_dtype
    from hybridrl.training.lora import merge_lora_state

    experts = lora.get("target_parameters") or []   # absent in checkpoints from before expert adapters
    merged, adapter = merge_lora_state(state, lora["alpha"] / lora["rank"], experts)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    out = resolve_dtype(dtype, "merge dtype")
    save_file({k: v.to(out).contiguous() for k, v in adapter.items()}, str(adapter_dir / "adapter_model.safetensors"))
    LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"],
               target_parameters=experts or None, exclude_modules=lora.get("exclude_modules"),
               lora_dropout=0.0, bias="none", task_type="CAUSAL_LM").save_pretrained(str(adapter_dir))
    return merged


def register(subparsers) -> None:
    p = subparsers.add_parser("merge", help="merge a sharded checkpoint into a HF model directory")
    p.add_argument("ckpt_dir", help="checkpoint directory (holding model/, huggingface/, hybridrl_checkpoint.json)")
    p.add_argument("out_dir", help="output HF directory")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dtype of the weights")
    p.set_defaults(func=lambda args: merge_checkpoint(args.ckpt_dir, args.out_dir, args.dtype) and 0)
