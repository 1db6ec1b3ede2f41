"""Merge a sharded checkpoint (checkpoint.py layout) into a HF directory that `from_pretrained` loads.

Choices: runs in one process without torch.distributed (`dcp.load(no_dist=True)` reads every shard). The
model skeleton is built on the meta device from `huggingface/config.json` (no random init, no memory), only
to learn the state-dict keys, shapes and dtypes; the loaded tensors are then assigned into it and written
with `save_pretrained` (safetensors, sharded by HF when large, tied weights handled by HF). Output dtype is
bf16 by default (what inference wants), fp32 on request. Tokenizer and generation-config files are copied.
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
    model = model_skeleton(hf_config, meta["role"])
    master = getattr(torch, meta.get("master_dtype", "float32"))
    state = {k: torch.empty(v.shape, dtype=master if v.is_floating_point() else v.dtype)
             for k, v in model.state_dict().items()}
    dcp.load(state, checkpoint_id=str(ckpt_dir / "model"), planner=DefaultLoadPlanner(allow_partial_load=True),
             no_dist=True)
    write_hf_model(state, hf_config, meta["role"], out_dir, dtype=dtype)
    hf_src = ckpt_dir / "huggingface"
    for f in hf_src.iterdir():
        if f.is_file() and not (out_dir / f.name).exists():
            shutil.copy2(f, out_dir / f.name)
    return out_dir


def register(subparsers) -> None:
    p = subparsers.add_parser("merge", help="merge a sharded checkpoint into a HF model directory")
    p.add_argument("ckpt_dir", help="checkpoint directory (holding model/, huggingface/, hybridrl_checkpoint.json)")
    p.add_argument("out_dir", help="output HF directory")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dtype of the weights")
    p.set_defaults(func=lambda args: merge_checkpoint(args.ckpt_dir, args.out_dir, args.dtype) and 0)
