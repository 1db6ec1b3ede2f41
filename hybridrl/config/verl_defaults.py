"""verl's keys that hybridrl has no use for, accepted at verl's default values.

A verl user's config is often a copy of verl's full generated config (`_generated_ppo_trainer.yaml`): every key at
its default, a few edited. ~350 of its keys are verl's machinery or features that are off by default (Hydra
`_target_` classes, profilers, worker and server settings, multi-token prediction, a generative reward model,
PF-PPO); hybridrl's schema has none of them. `config/verl/ppo_trainer_defaults.yaml` lists them with verl's default
values. The loader drops such a key where its value is exactly verl's default (it asks for nothing hybridrl does not
do) and names every dropped key in one warning; at any other value the key stays unknown and is refused, the error
naming verl's default (`schema.unknown_hint`).

`UNSET_WHEN_NULL`: our keys that verl's config sets to null meaning "not set" (its deprecated `warmup_style`, the
micro-batch sizes verl requires a user to fill in); a null there reads as the key left out, so our default applies
(`auto`: the run plan's choice; `constant`).

`python -m hybridrl.config.verl_defaults_table VERL/_generated_ppo_trainer.yaml` rewrites the table from a newer verl.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

__all__ = ["TABLE", "UNSET_WHEN_NULL", "is_verl_default", "verl_default", "verl_defaults"]

TABLE = Path(__file__).resolve().parent / "verl" / "ppo_trainer_defaults.yaml"
_NONE = object()

UNSET_WHEN_NULL = (
    "actor_rollout_ref.actor.optim.warmup_style", "critic.optim.warmup_style",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "reward_model.micro_batch_size_per_gpu",
)


@functools.lru_cache(maxsize=1)
def verl_defaults() -> dict[str, Any]:
    """{dotted verl key: verl's default value} for the keys hybridrl's schema does not have."""
    with open(TABLE) as f:
        return yaml.safe_load(f)


def verl_default(key: str) -> Any:
    """verl's default of `key` from the table, or `_NONE` where the table has no such key."""
    return verl_defaults().get(key, _NONE)


def is_verl_default(key: str, value: Any) -> bool:
    """True where `key` is one of the table's verl keys and `value` is exactly its default (a bool is not a number
    here: `0` does not stand for `false`)."""
    default = verl_default(key)
    return default is not _NONE and _same(default, value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b
