"""Test helpers: the typed config sections the training layer takes (training/), built from the packaged defaults
(ppo_trainer.yaml, loaded once) with a test's own values, as `load_config` hands them to the workers. A nested key
is given as a dict (`policy_loss={"loss_mode": "gspo"}`)."""

from __future__ import annotations

from functools import cache

from hybridrl.config import load_config
from hybridrl.config.sections import PPOConfig, Section
from hybridrl.config.sections.actor import ActorConfig
from hybridrl.config.sections.critic import CriticConfig
from hybridrl.config.sections.model import ModelConfig
from hybridrl.config.sections.optim import OptimConfig
from hybridrl.training.fsdp import FSDPDtypes, ModelSource

# the packaged FSDP dtypes (fp32 masters, bf16 compute, fp32 reduction; on CPU everything runs in fp32)
FP32_MASTERS = FSDPDtypes(model="fp32", param="bf16", reduce="fp32")


@cache
def packaged() -> PPOConfig:
    return load_config()


def with_values(section: Section, values: dict) -> Section:
    """`section` with each key of `values` set (a dict value sets the nested section's keys)."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(getattr(section, key), Section):
            section = section.with_value(key, with_values(getattr(section, key), value))
        else:
            section = section.with_value(key, value)
    return section


def actor_section(**values) -> ActorConfig:
    """`actor_rollout_ref.actor` with `values`."""
    return with_values(packaged().actor_rollout_ref.actor, values)


def critic_section(**values) -> CriticConfig:
    """`critic` with `values`."""
    return with_values(packaged().critic, values)


def optim_section(**values) -> OptimConfig:
    """`actor_rollout_ref.actor.optim` with `values`."""
    return with_values(packaged().actor_rollout_ref.actor.optim, values)


def model_section(**values) -> ModelConfig:
    """`actor_rollout_ref.model` with `values`."""
    return with_values(packaged().actor_rollout_ref.model, values)


def model_source(path) -> ModelSource:
    """An HF directory as training.fsdp.build_fsdp_model loads it (no config overrides, no remote code)."""
    return ModelSource(str(path), {}, False)
