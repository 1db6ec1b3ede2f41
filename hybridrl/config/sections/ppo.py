"""The whole PPO/GRPO config (`ppo_trainer.yaml`) and its `actor_rollout_ref` section."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.actor import ActorConfig, RefConfig
from hybridrl.config.sections.algorithm import AlgorithmConfig
from hybridrl.config.sections.base import Section
from hybridrl.config.sections.critic import CriticConfig
from hybridrl.config.sections.data import DataConfig
from hybridrl.config.sections.model import ModelConfig
from hybridrl.config.sections.reward_model import CustomRewardFunctionConfig, RewardModelConfig
from hybridrl.config.sections.rollout import RolloutConfig
from hybridrl.config.sections.rules import Findings
from hybridrl.config.sections.trainer import TrainerConfig


@dataclass(frozen=True)
class PPOConfig(Section):
    """The PPO/GRPO config: the sections of `ppo_trainer.yaml`."""

    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig

    def validate(self) -> list[str]:
        """Every section's rules (those between sections live with the section whose key they name first). Raises
        one ConfigError listing every problem; returns the warnings (things verl allows that are usually a mistake)."""
        found = Findings()
        roles = self.actor_rollout_ref
        self.data.check_sizes(found)
        self.trainer.check_sizes(found)
        roles.actor.check_sizes(found)
        roles.ref.check_sizes(found)
        roles.rollout.check_sizes(found)
        self.critic.check_sizes(self, found)
        self.reward_model.check_sizes(found)
        found.raise_errors()  # the rules below divide by these sizes
        self.data.check(self, found)
        roles.model.check(found)
        roles.actor.check(self, found)
        roles.ref.check(self, found)
        roles.rollout.check(self, found)
        self.critic.check(self, found)
        self.reward_model.check(self, found)
        self.algorithm.check(self, found)
        self.trainer.check(found, self.data.val_files)
        found.raise_errors()
        return found.warnings


@dataclass(frozen=True)
class ActorRolloutRefConfig(Section):
    """`actor_rollout_ref`."""

    hybrid_engine: bool
    """false = scheme A: a resident rollout engine with its own weights and KV"""
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig
