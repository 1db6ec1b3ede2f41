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


@dataclass(frozen=True)
class ActorRolloutRefConfig(Section):
    """`actor_rollout_ref`."""

    hybrid_engine: bool
    """false = scheme A: a resident rollout engine with its own weights and KV"""
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig
