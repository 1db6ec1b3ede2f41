"""The reward model's part of the run plan (reward_model.enable, style=model): its forward's micro-batch, whether
it gathers its weights once, and the longest input it scores."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.plan.model_shape import ModelShape
from hybridrl.plan.rollout_plan import KvCachePlan
from hybridrl.plan.sizing import LOGPROB_TOKENS_TARGET, Sizing


@dataclass(frozen=True)
class RewardModelPlan:
    micro_batch: int                    # sequences per forward per GPU
    unshard_once: bool
    max_length: int                     # input tokens at most (reward_model.max_length or prompt + response)

    def describe(self) -> str:
        """The reward model's line of `hybridrl config check`."""
        return f"reward model    micro-batch per GPU {self.micro_batch}, inputs up to {self.max_length} tokens"


def plan_reward_model(sizing: Sizing, kv_cache: KvCachePlan, shape: ModelShape) -> RewardModelPlan:
    """The largest micro-batch of the reward model (of `shape`) that fits next to `kv_cache`; predicts the
    reward_model phase."""
    layout, memory = sizing.layout, sizing.memory
    max_length = sizing.get("reward_model.max_length") or sizing.seq_len
    unshard_once = sizing.auto_unshard(shape)

    def peak(rows):
        return memory.reward_model_phase(rows, max_length, unshard_once, kv_cache.bytes)

    rows = sizing.pick("reward_model.micro_batch_size_per_gpu",
                       list(range(max(1, layout.train_batch_size * layout.n // layout.parallel.world_size), 0, -1)),
                       LOGPROB_TOKENS_TARGET, peak, max_length)
    sizing.predicted["reward_model"] = peak(rows)
    return RewardModelPlan(micro_batch=rows, unshard_once=unshard_once, max_length=max_length)
