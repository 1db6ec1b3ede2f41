"""Rule-based and custom rewards: scorers per data_source, custom-function loading, the reward manager.

RewardManager (it needs torch) is imported lazily so the scorer worker process starts without torch.
"""

from hybridrl.rewards.custom import CustomRewardFunction, load_custom_reward_function
from hybridrl.rewards.default import SCORERS, default_compute_score

__all__ = ["SCORERS", "CustomRewardFunction", "RewardManager", "default_compute_score",
           "load_custom_reward_function"]


def __getattr__(name):
    if name == "RewardManager":
        from hybridrl.rewards.reward_manager import RewardManager

        return RewardManager
    raise AttributeError(f"module 'hybridrl.rewards' has no attribute {name!r}")
