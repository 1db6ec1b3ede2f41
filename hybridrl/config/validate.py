"""Config validation, run at load time before any worker starts.

Two passes, both collecting every problem before raising one `ConfigError` (a `ValueError`), so a user
fixes a YAML in one round trip:
- `schema.check_schema`: unknown keys (named with the closest known key), types and allowed values (the
  annotations of the section dataclasses).
- `PPOConfig.validate` (PPO config only): the rules of each section (`check_sizes` / `check` methods beside its
  fields, run by `PPOConfig.validate`): positive sizes, batch arithmetic with the actual numbers, device mesh
  divisibility, ranges, values the types admit but hybridrl does not implement. Critic keys are checked only when
  `algorithm.adv_estimator == gae`, as the critic does not exist otherwise.
Things verl allows but that are usually a mistake (KL in the loss *and* in the reward, GRPO with n=1)
are returned as warnings, not errors. Ints are accepted where a float is expected (YAML `1` for `1.0`).
"""

from __future__ import annotations

from hybridrl.config.schema import check_schema
from hybridrl.config.sections import PPOConfig, Section

__all__ = ["validate_config"]


def validate_config(cfg: Section) -> list[str]:
    """Both passes: `cfg`'s values against its sections' types, then (a PPO config) their rules; returns warnings,
    raises ConfigError."""
    check_schema(cfg.to_dict(), type(cfg))
    return cfg.validate() if isinstance(cfg, PPOConfig) else []
