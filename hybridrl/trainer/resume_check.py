"""Resuming with changed settings: every changed key is listed at start, as taking effect, ignored, or refused.

Each checkpoint carries the resolved config it was saved with (`config.json`). On resume the current config is
compared with it key by key. A changed key is
- refused when it conflicts with what the checkpoint holds (another model or tokenizer than the weights were
  trained from, the master dtype, the data order the saved dataloader position refers to, adding or dropping
  the critic): the run stops before any worker loads, naming every such key with both values;
- ignored when the checkpoint's state wins (the in-reward KL controller's coefficient): listed so nobody
  believes a new value is in use;
- taking effect otherwise, since everything else is read from the config as the run goes. The optimizer
  settings (`*.optim.*`: lr, betas, weight decay, schedule) are re-applied over the loaded optimizer and
  scheduler state by `training.checkpoint.load_checkpoint`.

A model or tokenizer directory that moved is not a change: each checkpoint also saves a fingerprint of the local
directories those keys name (`model_files.json`: each model file's name, size and three 1 MiB samples of its bytes),
and a new path whose files give the saved fingerprint takes effect, said so. Without a saved fingerprint (a hub
id, an older checkpoint) the path text is what is compared.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from hybridrl.config.errors import RunStopError
from hybridrl.config.sections import PPOConfig
from hybridrl.dotted import dotted_leaves

__all__ = ["CONFIG_FILE", "MODEL_FILES", "ResumeConfigError", "save_resolved_config", "classify_changes",
           "check_resumable", "check_resume_config", "model_fingerprint", "refuse_weightless"]

logger = logging.getLogger("hybridrl.resume")

CONFIG_FILE = "config.json"
MODEL_FILES = "model_files.json"
# the path keys whose directories are fingerprinted, so that a moved copy resumes
FINGERPRINTED = ("actor_rollout_ref.model.path", "critic.model.path", "data.tokenizer", "critic.model.tokenizer_path")
_MODEL_SUFFIXES = (".json", ".safetensors", ".bin", ".pt", ".model", ".txt", ".tiktoken", ".jinja", ".py")
_SAMPLE = 1 << 20

# how a resumed run is pointed at its checkpoint, or derived from other keys: never compared
NOT_COMPARED = ("trainer.resume_mode", "trainer.resume_from_path", "trainer.default_local_dir",
                "actor_rollout_ref.actor.optim.total_training_steps", "critic.optim.total_training_steps")

_WEIGHTS = "the checkpoint holds weights trained from the saved value (a moved copy of it resumes where the checkpoint " \
           "has its fingerprint); to start from a checkpoint's weights with other settings, merge it (`hybridrl " \
           "merge`) and start a fresh run (trainer.resume_mode=disable) from it"
_DATA = "the saved dataloader position is a place in the saved data order; change it only in a fresh run"
REFUSED = {
    "actor_rollout_ref.model.path": _WEIGHTS,
    "actor_rollout_ref.model.override_config": _WEIGHTS,
    "actor_rollout_ref.model.external_lib": _WEIGHTS,
    "critic.model.path": _WEIGHTS,
    "critic.model.override_config": _WEIGHTS,
    "data.tokenizer": "the model was trained on the saved tokenizer's token ids",
    "critic.model.tokenizer_path": "the critic was trained on the saved tokenizer's token ids",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "the optimizer state was saved for master weights of the "
                                                       "saved dtype",
    "actor_rollout_ref.actor.checkpoint.contents": "the checkpoint holds only what the saved value lists",
    "data.train_files": _DATA,
    "data.shuffle": _DATA,
    "data.seed": _DATA,
}
IGNORED: dict[str, str] = {}  # keys whose checkpointed state always wins (none today; see _special for the KL coef)
NOTES = {
    "trainer.seed": "the sampling and mini-batch shuffle seeds of the coming steps derive from it; the restored RNG "
                    "states are the checkpoint's",
    "optim.": "applied to the loaded optimizer and lr schedule",
    "trainer.total_epochs": "the run ends at the new horizon; a cosine schedule's horizon follows it",
    "trainer.total_training_steps": "the run ends at the new horizon; a cosine schedule's horizon follows it",
    "data.train_batch_size": "the prompts go on at the saved sample of the saved order, in batches of the new size",
    "data.gen_batch_size": "the prompts go on at the saved sample of the saved order, in batches of the new size",
    "trainer.nnodes": "model and optimizer are resharded; RNG states are not restored (sampling differs)",
    "trainer.n_gpus_per_node": "model and optimizer are resharded; RNG states are not restored (sampling differs)",
}


class ResumeConfigError(ValueError, RunStopError):
    """The config changes a setting that cannot change on resume."""


def model_fingerprint(path) -> str | None:
    """A digest of a local model or tokenizer directory: every file with a model suffix, by name and size, with its
    first, middle and last MiB. None where `path` is no local directory (a hub id, unset). Another checkpoint of the
    same shapes differs in those bytes; reading 3 MiB a file keeps this cheap at any model size."""
    if not isinstance(path, str) or not os.path.isdir(os.path.expanduser(path)):
        return None
    digest = hashlib.blake2b(digest_size=16)
    for f in sorted(Path(os.path.expanduser(path)).iterdir()):
        if not f.is_file() or f.suffix not in _MODEL_SUFFIXES:
            continue
        size = f.stat().st_size
        digest.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fp:
            for offset in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
                fp.seek(offset)
                digest.update(fp.read(_SAMPLE))
    return digest.hexdigest()


def save_resolved_config(ckpt_dir: str | os.PathLike, config: PPOConfig) -> None:
    """The resolved config (`config.json`) and the fingerprints of its local model directories (`model_files.json`)."""
    tree = config.to_dict()
    (Path(ckpt_dir) / CONFIG_FILE).write_text(json.dumps(tree, indent=1))
    leaves = dotted_leaves(tree)
    prints = {key: model_fingerprint(leaves.get(key)) for key in FINGERPRINTED}
    (Path(ckpt_dir) / MODEL_FILES).write_text(json.dumps({k: v for k, v in prints.items() if v}, indent=1))


def _same(a, b) -> bool:
    """Equal values, with paths compared as the files they name ('~/m' and '/root/m' are one model)."""
    def norm(v):
        if isinstance(v, list):
            return [norm(x) for x in v]
        return os.path.abspath(os.path.expanduser(v)) if isinstance(v, str) and "/" in v else v
    return norm(a) == norm(b)


def _rule(key: str, table: dict) -> str | None:
    """The reason for the first entry naming `key` or a section above it ("optim." = any section of that name)."""
    for name, why in table.items():
        if key == name or key.startswith(name + ".") or (name.endswith(".") and f".{name}" in f".{key}"):
            return why
    return None


def _special(key: str, saved: dict, now: dict) -> tuple[str, str] | None:
    """Keys whose verdict depends on other settings."""
    if key == "algorithm.adv_estimator" and (saved[key] == "gae") != (now[key] == "gae"):
        return "refused", "gae trains a critic and the others do not: the checkpoint's critic state would be missing " \
                          "or dropped"
    in_reward = saved.get("algorithm.use_kl_in_reward") and now.get("algorithm.use_kl_in_reward")
    if key == "algorithm.kl_ctrl.kl_coef" and in_reward:
        return "ignored", "the KL controller's current coefficient is restored from the checkpoint"
    return None


def _moved(key: str, new, saved_prints: dict) -> bool:
    """The saved directory of `key` is found, by its fingerprint, at the new path."""
    return key in saved_prints and model_fingerprint(new) == saved_prints[key]


def classify_changes(saved_config: dict, config: PPOConfig, saved_prints: dict | None = None) -> dict[str, list[str]]:
    """{"refused" | "ignored" | "takes effect": ["key: saved → now (why)", ...]} for every key whose value differs.
    `saved_prints`: the checkpoint's model fingerprints (`model_files.json`), where it has them."""
    saved_prints = saved_prints or {}
    saved, now = dotted_leaves(saved_config), dotted_leaves(config.to_dict())
    out: dict[str, list[str]] = {"refused": [], "ignored": [], "takes effect": []}
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key, "<unset>"), now.get(key, "<unset>")
        if _same(old, new) or key in NOT_COMPARED:
            continue
        if key.startswith("critic.") and now.get("algorithm.adv_estimator") != "gae":
            continue  # no critic in this run: its settings are unused, resumed or not
        verdict = _special(key, saved, now)
        if verdict is None and key in FINGERPRINTED and _moved(key, new, saved_prints):
            verdict = ("takes effect", "the same files, moved: their fingerprint matches the checkpoint's")
        if verdict is None and (why := _rule(key, REFUSED)):
            verdict = ("refused", why)
        if verdict is None and (why := _rule(key, IGNORED)):
            verdict = ("ignored", why)
        if verdict is None:
            verdict = ("takes effect", _rule(key, NOTES) or "read from the config as the run goes")
        out[verdict[0]].append(f"{key}: {old!r} in the checkpoint, {new!r} now ({verdict[1]})")
    return out


def check_resume_config(ckpt_dir: str | os.PathLike, config: PPOConfig) -> dict[str, list[str]]:
    """Compare `config` with the one saved in `ckpt_dir`; log every changed key, raise ResumeConfigError naming the
    refused ones. Returns the classification ({} when the checkpoint has no saved config)."""
    path = Path(ckpt_dir) / CONFIG_FILE
    if not path.is_file():
        logger.warning("%s has no %s (saved before configs were kept with checkpoints): settings changed since "
                       "cannot be checked", ckpt_dir, CONFIG_FILE)
        return {}
    prints_path = Path(ckpt_dir) / MODEL_FILES
    prints = json.loads(prints_path.read_text(encoding="utf-8")) if prints_path.is_file() else {}
    changes = classify_changes(json.loads(path.read_text(encoding="utf-8")), config, prints)
    if changes["refused"]:
        raise ResumeConfigError(f"cannot resume from {ckpt_dir} with these settings changed:\n  - "
                                + "\n  - ".join(changes["refused"]))
    for verdict in ("ignored", "takes effect"):
        if changes[verdict]:
            logger.warning("resuming from %s, changed settings %s:\n  - %s", ckpt_dir,
                           "IGNORED (the checkpoint's value is used)" if verdict == "ignored" else "that take effect",
                           "\n  - ".join(changes[verdict]))
    return changes


def check_resumable(ckpt_dir: str | os.PathLike, roles: list[str]) -> None:
    """Raise ResumeConfigError where a role's checkpoint in `ckpt_dir` was saved without its weights ('model' not in
    its contents: an export such as verl's save_contents=['hf_model'])."""
    for role in roles:
        key = "actor_rollout_ref.actor" if role == "actor" else role
        refuse_weightless(Path(ckpt_dir) / role, ckpt_dir, f"its {role} was", f"{key}.checkpoint.contents")


def refuse_weightless(saved_dir: str | os.PathLike, ckpt_dir: str | os.PathLike, what: str, key: str) -> None:
    """Raise ResumeConfigError where the checkpoint in `saved_dir` (of the resume point `ckpt_dir`; `what` and `key`
    name it and its contents key in the message) holds no 'model'."""
    from hybridrl.training.checkpoint import saved_contents

    contents = saved_contents(saved_dir)
    if contents is not None and "model" not in contents:
        raise ResumeConfigError(
            f"cannot resume from {ckpt_dir}: {what} saved with '{key}' = {sorted(contents)}, without 'model' (an "
            "export of the weights, not a resume point). Start a fresh run (trainer.resume_mode=disable; its "
            "huggingface/ directory holds the weights), or resume from a checkpoint saved with 'model'")
