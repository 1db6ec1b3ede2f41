"""The typed config: one frozen dataclass per YAML section (`PPOConfig` for ppo_trainer.yaml, `SFTConfig` for
sft_trainer.yaml), each field annotated with its type and documented by the string below it."""

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.ppo import ActorRolloutRefConfig, PPOConfig
from hybridrl.config.sections.sft import SFTConfig

# packaged defaults file (hybridrl/config/<name>.yaml) -> the section it is read into
ROOTS: dict[str, type[Section]] = {"ppo_trainer": PPOConfig, "sft_trainer": SFTConfig}

__all__ = ["ROOTS", "ActorRolloutRefConfig", "PPOConfig", "SFTConfig", "Section"]
