"""SFT checkpoints and resume: `global_step_N` directories under trainer.default_local_dir with the atomic layout of
checkpoint_manager.py (written by every rank, committed by rank 0), holding what trainer.checkpoint.contents names
(training/checkpoint.py: the model's shards, the optimizer, the lr scheduler and RNG states, an HF copy) and the facts
the data order depends on. A resume reads them back and refuses a data order that changed since (the saved position
would point elsewhere in it); the step comes from the directory's name.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from hybridrl.trainer.checkpoint_manager import CheckpointManager, save_distributed, step_of
from hybridrl.trainer.resume_check import ResumeConfigError, refuse_weightless
from hybridrl.training.checkpoint import load_checkpoint, save_checkpoint

__all__ = ["SFT_ROLE", "data_order_facts", "resume_sft", "save_sft_checkpoint", "sft_checkpoints"]

SFT_ROLE = "causal_lm"


def data_order_facts(cfg, rows: int) -> dict:
    """What the position of a step in the training data depends on."""
    return {"data.train_batch_size": cfg.data.train_batch_size, "data.shuffle": cfg.data.shuffle,
            "trainer.seed": cfg.trainer.seed, "training rows": rows}


def sft_checkpoints(t, rank: int) -> CheckpointManager | None:
    """Rank 0's manager of {trainer.default_local_dir}/global_step_N (the others write into what it begins)."""
    keep = t.max_ckpt_to_keep
    if keep is not None and keep < 1:
        raise ValueError(f"trainer.max_ckpt_to_keep={keep}: keep null (all) or >= 1 checkpoints")
    if rank != 0:
        return None
    import os

    return CheckpointManager(os.path.expanduser(t.default_local_dir), max_to_keep=t.max_ckpt_to_keep)


def save_sft_checkpoint(manager: CheckpointManager | None, step: int, module, optimizer, scheduler, tokenizer,
                        contents, facts: dict) -> Path:
    """Collective: every rank writes its shards of step `step`; rank 0 commits."""
    def write(tmp: Path, rank: int) -> None:
        save_checkpoint(tmp, module, optimizer, scheduler, hf_config=module.config, tokenizer=tokenizer,
                        role=SFT_ROLE, contents=tuple(contents), extra={"data_order": facts})

    return save_distributed(manager, step, write)


def resume_sft(t, manager: CheckpointManager | None, module, optimizer, scheduler, facts: dict) -> int:
    """Collective: the step resumed from (0: none, by trainer.resume_mode / resume_from_path), its state loaded."""
    box = [None]
    if dist.get_rank() == 0:
        try:
            path = manager.resolve_resume(t.resume_mode, t.resume_from_path)
            box[0] = {"path": None if path is None else str(path), "error": None}
        except Exception as e:   # every rank raises it, none waits for a broadcast that never comes
            box[0] = {"path": None, "error": e}
    dist.broadcast_object_list(box, src=0)
    if box[0]["error"] is not None:
        raise box[0]["error"]
    if box[0]["path"] is None:
        return 0
    path = Path(box[0]["path"])
    refuse_weightless(path, path, "it was", "trainer.checkpoint.contents")
    extra = load_checkpoint(path, module, optimizer, scheduler, contents=tuple(t.checkpoint.contents))
    saved = extra.get("data_order") if "extra" in t.checkpoint.contents else None
    changed = {k: (saved[k], v) for k, v in facts.items() if saved is not None and saved.get(k) != v}
    if changed:
        raise ResumeConfigError(f"cannot resume from {path}: the training data order changed since ("
                                + "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in changed.items())
                                + "), so the saved position would point elsewhere; restore them or start a fresh run "
                                "(trainer.resume_mode=disable)")
    return step_of(path)
