"""verl's keys that hybridrl has no use for, accepted at verl's default values.

A verl user's config is often a copy of verl's full generated config (`_generated_ppo_trainer.yaml`): every key at
its default, a few edited. ~350 of its keys are verl's machinery or features that are off by default (Hydra
`_target_` classes, profilers, worker and server settings, multi-token prediction, a generative reward model);
hybridrl's schema has none of them. `config/verl/ppo_trainer_defaults.yaml` lists them with verl's default values.
The loader drops such a key where its value is exactly verl's default (it asks for nothing hybridrl does not do) and
names every dropped key in one warning; at any other value the key stays unknown and is refused, the error naming
verl's default (`schema.unknown_hint`). Two kinds are dropped at other values too (`drop_verl_key`):
`VERL_ANY_VALUE`, whose every value asks for what hybridrl does anyway (verl's example scripts set them), and
`SERVED_REWARD_MODEL`, verl's settings for serving a scoring reward model, which change nothing where the model
scores on its own (`check_served_reward_model` decides once the config is resolved).

verl's SFT trainer (`sft_trainer.yaml` with its optimizer defaults) has its own table,
`config/verl/sft_trainer_defaults.yaml`, and `SFT_ANY_VALUE`; the SFT config reads only those.

`UNSET_WHEN_NULL`: our keys that verl's config sets to null meaning "not set" (its deprecated `warmup_style`, the
micro-batch sizes verl requires a user to fill in); a null there reads as the key left out, so our default applies
(`auto`: the run plan's choice; `constant`).

`python -m hybridrl.config.verl_defaults_table VERL/verl/trainer/config` rewrites both tables from a newer verl.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import yaml

from hybridrl.config.errors import ConfigError

__all__ = ["ANY_VALUE", "SERVED_REWARD_MODEL", "SFT_ANY_VALUE", "TABLES", "UNSET_WHEN_NULL", "VERL_ANY_VALUE",
           "check_served_reward_model", "drop_verl_key", "grouped", "is_verl_default", "verl_defaults"]

log = logging.getLogger("hybridrl.config")

# one table per config: verl's PPO trainer's keys, and its SFT trainer's (fsdp_sft_trainer)
TABLES = {root: Path(__file__).resolve().parent / "verl" / f"{root}_defaults.yaml"
          for root in ("ppo_trainer", "sft_trainer")}

UNSET_WHEN_NULL = (
    "actor_rollout_ref.actor.optim.warmup_style", "critic.optim.warmup_style",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "reward_model.micro_batch_size_per_gpu",
)


# verl keys accepted at any value: every value asks for what hybridrl does anyway (dropped, the reason logged where
# the value is not verl's default)
VERL_ANY_VALUE: dict[str, str] = {
    "actor_rollout_ref.rollout.enable_chunked_prefill": "a vLLM scheduler setting; hybridrl's engine prefills each "
    "prompt whole within rollout.max_num_batched_tokens and runs prefill and decode steps apart",
    "actor_rollout_ref.rollout.load_format": "the hybrid engine receives the actor's weights at every switch "
    "(hybrid/reshard.py), there is nothing to load",
    "actor_rollout_ref.rollout.layered_summon": "the engine always receives the merged weights one tensor at a time, "
    "which is what layered_summon buys in verl",
    "actor_rollout_ref.rollout.calculate_log_probs": "the engine always returns its samples' log-probs "
    "(rollout_log_probs)",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "the engine always wakes its weights first, then its KV cache",
    "actor_rollout_ref.model.use_shm": "models load from the local path as given",
    "actor_rollout_ref.model.use_fused_kernels": "the fused log-prob / entropy head (training/fused_logprob.py) "
    "always runs",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "the fused log-prob / entropy head "
    "(training/fused_logprob.py) chooses its own kernels",
    "actor_rollout_ref.actor.entropy_checkpointing": "the fused log-prob / entropy head (training/fused_logprob.py) "
    "never holds the logits of a micro-batch, which is what entropy checkpointing saves in verl",
    "actor_rollout_ref.ref.entropy_checkpointing": "the reference pass computes no entropy",
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": "Σπ² is measured chunk by chunk without a gradient "
    "(algorithms/chunked_logprob.py): no logits are kept to checkpoint",
    "critic.model.use_shm": "models load from the local path as given",
    "reward_model.model.use_shm": "models load from the local path as given",
    "reward_model.model.use_fused_kernels": "the reward model runs its HF forward",
    "reward_model.model.use_remove_padding": "the reward model's forwards are length-sorted batches within a token "
    "budget (reward_model.use_dynamic_bsz, forward_max_token_len_per_gpu)",
    "trainer.use_legacy_worker_impl": "verl's switch between its two worker implementations; hybridrl has one",
    "data.use_shm": "data files are read from their paths as given",
    "data.filter_overlong_prompts_workers": "prompts are tokenized and filtered once, when the dataset loads",
}

# verl's SFT trainer keys accepted at any value
SFT_ANY_VALUE: dict[str, str] = {
    "trainer.nnodes": "the SFT ranks are torchrun's (WORLD_SIZE), whatever the config says",
    "trainer.n_gpus_per_node": "the SFT ranks are torchrun's (WORLD_SIZE), whatever the config says",
    "optim.lr_scheduler_type": "verl's SFT trainer schedules by optim.lr_scheduler, as hybridrl does",
    "model.use_shm": "models load from the local path as given",
    "data.use_shm": "data files are read from their paths as given",
    "model.strategy": "SFT shards with FSDP2 (verl's fsdp and fsdp2 train the same model)",
}
ANY_VALUE = {"ppo_trainer": VERL_ANY_VALUE, "sft_trainer": SFT_ANY_VALUE}

# verl's settings for serving a scoring reward model on its own engine (its reward loop): where the model scores on
# its own (reward_model.enable, style model, no custom reward function) they change nothing here, where it runs as
# the reward model worker on the training GPUs with the same scores; else they configure a server a custom reward
# function would call, which hybridrl does not run
SERVED_REWARD_MODEL = ("reward_model.rollout", "reward_model.num_workers", "reward_model.use_reward_loop",
                       "reward_model.enable_resource_pool", "reward_model.n_gpus_per_node", "reward_model.nnodes")


@functools.lru_cache(maxsize=2)
def verl_defaults(root: str = "ppo_trainer") -> dict[str, Any]:
    """{dotted verl key: verl's default value} for the keys hybridrl's `root` config (ppo_trainer | sft_trainer)
    does not have."""
    with open(TABLES[root]) as f:
        return yaml.safe_load(f)


def is_verl_default(key: str, value: Any, root: str = "ppo_trainer") -> bool:
    """True where `key` is one of the table's verl keys and `value` is exactly its default (a bool is not a number
    here: `0` does not stand for `false`)."""
    table = verl_defaults(root)
    return key in table and _same(table[key], value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def drop_verl_key(key: str, value: Any, dropped: list[str], served: list[tuple[str, Any, str]], source: str,
                  root: str = "ppo_trainer") -> bool:
    """Whether the verl key `key` (none of ours) = `value` is left out, recorded in `dropped`: at verl's default
    (the table), or at any value where every value asks for what hybridrl does anyway (VERL_ANY_VALUE, SFT_ANY_VALUE;
    a value other than verl's default is logged with the reason). SERVED_REWARD_MODEL keys at other values go to
    `served` (key, value, source), settled once the config is resolved (`check_served_reward_model`)."""
    at_default = is_verl_default(key, value, root)
    any_value = ANY_VALUE[root]
    if not at_default and root == "ppo_trainer" and any(key == k or key.startswith(k + ".")
                                                        for k in SERVED_REWARD_MODEL):
        served.append((key, value, source))
        return True
    if not at_default and key not in any_value:
        return False
    if not at_default:
        log.warning("config: %s=%r changes nothing here: %s", key, value, any_value[key])
    dropped.append(key)
    return True


def grouped(keys: list[str], depth: int = 3) -> str:
    """`keys` counted under their first `depth` dotted parts: 'a.b.c.* (12), a.b.d'."""
    groups: dict[str, int] = {}
    for key in keys:
        parts = key.split(".")
        head = ".".join(parts[:depth]) + (".*" if len(parts) > depth else "")
        groups[head] = groups.get(head, 0) + 1
    return ", ".join(head if n == 1 else f"{head} ({n})" for head, n in groups.items())


def check_served_reward_model(cfg, served: list[tuple[str, Any, str]]) -> None:
    """SERVED_REWARD_MODEL keys (of the resolved config `cfg`): logged where the reward model scores on its own,
    else refused naming each."""
    if not served:
        return
    keys = ", ".join(f"{key}={value!r}" for key, value, _ in served)
    rm = cfg.reward_model
    if rm.enable and rm.style == "model" and cfg.custom_reward_function.path is None:
        log.warning("config: %s configure verl's server for the scoring reward model; here it runs as the reward "
                    "model worker on the training GPUs, with the same scores (the classifier's output at the last "
                    "token)", keys)
        return
    why = ("reward_model.enable is false" if not rm.enable else f"reward_model.style={rm.style!r}" if
           rm.style != "model" else "a custom reward function is set (in verl it would call that server: a "
           "generative reward model)")
    raise ConfigError([f"{source}: '{key}' = {value!r}: verl's key, a server for the reward model; {why}, and "
                       "hybridrl runs no such server (a scoring model runs with reward_model.enable=true, style=model; "
                       "the policy judges with style=judge): remove it" for key, value, source in served])
