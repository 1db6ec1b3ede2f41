"""Values that a key's type and allowed values admit but hybridrl does not implement: refused at load time, each
message naming the key, the value and the rule, so no key is accepted and then silently does nothing.

Called by `validate.check_semantics` on the resolved config (a plain dict).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from hybridrl.dotted import dotted_get

__all__ = ["TOKENIZER_FILES", "check_limits", "same_tokenizer"]

ACTOR = "actor_rollout_ref.actor"
# the files a HF tokenizer is loaded from; two directories with equal copies hold the same tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json")


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def same_tokenizer(a: str, b: str) -> bool:
    """The same path, or two local directories whose tokenizer files are byte-for-byte equal."""
    if _real(a) == _real(b):
        return True
    da, db = Path(_real(a)), Path(_real(b))
    if not (da.is_dir() and db.is_dir()):
        return False
    names = [n for n in TOKENIZER_FILES if (da / n).is_file() or (db / n).is_file()]
    return bool(names) and all((da / n).is_file() and (db / n).is_file()
                               and (da / n).read_bytes() == (db / n).read_bytes() for n in names)


def check_limits(c: dict) -> list[str]:
    g = partial(dotted_get, c)
    errors = []
    workers = g("data.dataloader_num_workers")
    if workers != 0:
        errors.append(f"'data.dataloader_num_workers' = {workers}: must be 0 (prompts are tokenized once when the "
                      "dataset loads and batches are collated in the driver; there is no work for loader processes)")
    actor_keep, critic_keep = g("trainer.max_actor_ckpt_to_keep"), g("trainer.max_critic_ckpt_to_keep")
    if critic_keep is not None and critic_keep != actor_keep:
        errors.append(f"'trainer.max_critic_ckpt_to_keep' = {critic_keep} differs from 'trainer.max_actor_ckpt_to_keep'"
                      f" = {actor_keep}: one checkpoint directory per step holds both actor and critic (a step "
                      "without its critic could not be resumed); set it to null or to the actor's value")
    contents = list(g(f"{ACTOR}.checkpoint.contents"))
    if "model" not in contents:
        errors.append(f"'{ACTOR}.checkpoint.contents' = {contents} must include 'model' (a checkpoint without "
                      "the weights cannot be resumed)")
    errors += _policy_loss_errors(g(f"{ACTOR}.policy_loss"))
    errors += _multi_turn_errors(g("actor_rollout_ref.rollout"))
    if g("algorithm.adv_estimator") == "gae":  # the critic exists only then
        actor_tok = g("data.tokenizer") or g("actor_rollout_ref.model.path")
        critic_tok = g("critic.model.tokenizer_path")
        if not same_tokenizer(critic_tok, actor_tok):
            errors.append(f"'critic.model.tokenizer_path' = {critic_tok!r} is not the actor's tokenizer "
                          f"{actor_tok!r} (data.tokenizer, else actor_rollout_ref.model.path): the critic scores the "
                          "actor's token ids, so it must use the same tokenizer (same path or identical files)")
    return errors


def _policy_loss_errors(p: dict) -> list[str]:
    key = f"{ACTOR}.policy_loss"
    errors = [f"'{key}.{name}' = {p[name]} must be in (0, 1]" for name in ("clip_cov_ratio", "kl_cov_ratio")
              if not 0 < p[name] <= 1]
    if not p["clip_cov_lb"] < p["clip_cov_ub"]:
        errors.append(f"'{key}.clip_cov_lb' = {p['clip_cov_lb']} must be < '{key}.clip_cov_ub' = {p['clip_cov_ub']}")
    return errors


def _multi_turn_errors(rollout: dict) -> list[str]:
    key = "actor_rollout_ref.rollout.multi_turn"
    mt = rollout["multi_turn"]
    errors = []
    for name in ("max_assistant_turns", "max_user_turns", "max_tokens_per_turn"):
        if mt[name] is not None and mt[name] < 1:
            errors.append(f"'{key}.{name}' = {mt[name]} must be null (no limit) or >= 1")
    for name in ("max_parallel_calls", "max_tool_response_length"):
        if mt[name] < 1:
            errors.append(f"'{key}.{name}' = {mt[name]} must be >= 1")
    if not mt["enable"]:
        return errors
    loop = mt["agent_loop"]
    if mt["tool_config_path"] is None and mt["interaction_config_path"] is None and loop["path"] is None:
        errors.append(f"'{key}.enable' = true needs '{key}.tool_config_path' (a YAML listing the tools), "
                      f"'{key}.interaction_config_path' (verl's interaction YAML) or '{key}.agent_loop.path' "
                      "(your AgentLoop's file)")
    for name, path in (("tool_config_path", mt["tool_config_path"]),
                       ("interaction_config_path", mt["interaction_config_path"]), ("agent_loop.path", loop["path"])):
        if path is not None and not Path(os.path.expanduser(path)).is_file():
            errors.append(f"'{key}.{name}' = {path!r}: no such file")
    if loop["path"] is not None:
        if not loop["name"]:
            errors.append(f"'{key}.agent_loop.name' = {loop['name']!r}: name the AgentLoop subclass in "
                          f"'{key}.agent_loop.path'")
        for name in ("tool_config_path", "interaction_config_path"):
            if mt[name] is not None:
                errors.append(f"'{key}.{name}' = {mt[name]!r} with '{key}.agent_loop.path': the agent loop replaces "
                              "the tool agent; set one of them to null")
    if rollout["name"] != "native":
        errors.append(f"'{key}.enable' = true runs in the native engine: 'actor_rollout_ref.rollout.name' = "
                      f"{rollout['name']!r} must be 'native'")
    return errors
