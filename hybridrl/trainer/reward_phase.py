"""The reward phase on the driver: the model-based score first (the reward-model worker group, or the policy as
judge), stored as verl's `rm_scores`, then the reward function, which reads it (rewards/reward_manager.py: the
score is the reward, or a custom function combines it with the rule score).

Metrics: the workers' per-rank counts are summed (`reward_model/truncated`, and the judge's
`reward_model/judge_failures`, `reward_model/judge_overlong`); `reward_model/score/{mean,max,min}` are taken over
the whole batch here, so they mean the same whatever the data-parallel split.
"""

from __future__ import annotations

from hybridrl.protocol import DataProto
from hybridrl.rewards.token_level import score_metrics

__all__ = ["RM_COUNTS", "compute_reward"]

RM_COUNTS = ("reward_model/truncated", "reward_model/judge_failures", "reward_model/judge_overlong")
_TENSORS = ["input_ids", "attention_mask", "responses", "response_mask"]
_NON_TENSORS = ["raw_prompt", "reward_model"]   # the chat (re-rendering, {prompt}); ground truth ({ground_truth})


def compute_reward(batch: DataProto, reward_fn, reward_model=None) -> tuple[dict, dict, dict]:
    """(reward_fn's result, reward-model metrics, worker metrics as lists per rank). With a reward model the
    batch gains `rm_scores` [B, R] before reward_fn reads it."""
    rm_metrics: dict = {}
    worker: dict = {}
    if reward_model is not None:
        inputs = batch.select(_TENSORS, [k for k in _NON_TENSORS if k in batch.non_tensor_batch])
        out = reward_model.compute_rm_score(inputs)
        worker = out.meta_info.pop("metrics", {})
        rm_metrics = {k: float(sum(worker.pop(k))) for k in RM_COUNTS if k in worker}
        rm_metrics.update(score_metrics(out.batch["rm_scores"].sum(-1)))
        batch.batch["rm_scores"] = out.batch["rm_scores"]
    return reward_fn(batch), rm_metrics, worker
