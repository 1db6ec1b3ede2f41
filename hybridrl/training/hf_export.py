"""A HF `from_pretrained` directory from a full state dict: what a merged checkpoint and an exported model share.

Used by `checkpoint.save_hf_model` (gathered from FSDP shards in a run) and `merge.merge_checkpoint` (read from
a saved checkpoint offline); kept apart from both so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["model_skeleton", "write_hf_model"]


def model_skeleton(hf_config, role: str):
    """The role's HF model class built on the meta device: state-dict keys, shapes and dtypes, no memory."""
    from hybridrl.training.fsdp import _model_class

    with torch.device("meta"):
        return _model_class(role).from_config(hf_config, dtype=torch.float32)


def write_hf_model(state_dict: dict, hf_config, role: str, out_dir, dtype=torch.bfloat16, tokenizer=None) -> Path:
    """Write `state_dict` (full, HF names) as a `from_pretrained` directory in `dtype`; missing weights other
    than tied ones are an error naming them."""
    from hybridrl.training.fsdp import resolve_dtype

    dtype = resolve_dtype(dtype, "merge dtype")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model_skeleton(hf_config, role)
    expected = set(model.state_dict())
    missing = sorted(expected - set(state_dict))
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if [k for k in missing if k not in tied]:
        raise ValueError(f"checkpoint is missing weights {missing[:5]} (of {len(missing)}) for {type(model).__name__}")
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items() if k in expected}
    model.load_state_dict(cast, strict=False, assign=True)
    model.tie_weights()
    model.config.dtype = dtype
    model.save_pretrained(out_dir, state_dict=cast)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
