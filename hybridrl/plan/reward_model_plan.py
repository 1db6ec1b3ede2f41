"""The reward model's part of the run plan (reward_model.enable, style=model): its forward's micro-batch (rows, or a
token budget with use_dynamic_bsz), whether it gathers its weights once, and the longest input it scores."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.plan.model_shape import ModelShape
from hybridrl.plan.rollout_plan import KvCachePlan
from hybridrl.plan.sizing import LOGPROB_TOKENS_TARGET, MicroBatching, Sizing

RM = "reward_model"


@dataclass(frozen=True)
class RewardModelPlan:
    forward: MicroBatching              # per GPU: rows, or (use_dynamic_bsz) a budget of rows x longest tokens
    max_length: int                     # input tokens at most (reward_model.max_length or prompt + response)

    def describe(self) -> str:
        """The reward model's line of `hybridrl config check`."""
        per = (f"micro-batch per GPU {self.forward.rows}" if self.forward.rows is not None else
               f"micro-batches per GPU of at most {self.forward.max_tokens} tokens (inputs sorted by length, "
               "counted at each forward's longest)")
        return f"reward model    {per}, inputs up to {self.max_length} tokens"


def plan_reward_model(sizing: Sizing, kv_cache: KvCachePlan, shape: ModelShape) -> RewardModelPlan:
    """The largest micro-batch (or token budget) of the reward model (of `shape`) that fits next to `kv_cache`;
    predicts the reward_model phase."""
    layout, memory = sizing.layout, sizing.memory
    max_length = sizing.get(f"{RM}.max_length") or sizing.seq_len
    unshard_once = sizing.auto_unshard(shape)

    def peak(rows, tokens=max_length):
        return memory.reward_model_phase(rows, tokens, unshard_once, kv_cache.bytes)

    if sizing.dynamic(f"{RM}.use_dynamic_bsz", f"{RM}.micro_batch_size_per_gpu"):
        tokens = sizing.pick_tokens(f"{RM}.forward_max_token_len_per_gpu", LOGPROB_TOKENS_TARGET,
                                    lambda t: peak(1, t), longest=max_length)
        sizing.predicted["reward_model"] = peak(1, tokens)
        return RewardModelPlan(MicroBatching(max_tokens=tokens, unshard_once=unshard_once), max_length)
    rows = sizing.pick(f"{RM}.micro_batch_size_per_gpu",
                       list(range(max(1, layout.train_batch_size * layout.n // layout.parallel.world_size), 0, -1)),
                       LOGPROB_TOKENS_TARGET, peak, max_length)
    sizing.predicted["reward_model"] = peak(rows)
    return RewardModelPlan(MicroBatching(rows=rows, unshard_once=unshard_once), max_length)
