"""The reward phase on the driver: the model-based score first (the reward-model worker group, or the policy as
judge), stored as verl's `rm_scores`, then the reward function, which reads it (rewards/reward_manager.py: the
score is the reward, or a custom function combines it with the rule score). With
`reward_model.launch_reward_fn_async` the reward function runs in a driver thread (`PendingReward`) while the trainer
goes on with the passes that do not read the scores.

Metrics: the workers' per-rank counts are summed (`reward_model/truncated`, and the judge's
`reward_model/judge_failures`, `reward_model/judge_overlong`); `reward_model/score/{mean,max,min}` are taken over
the whole batch here, so they mean the same whatever the data-parallel split.
"""

from __future__ import annotations

import time

from hybridrl.protocol import DataProto
from hybridrl.rewards.token_level import score_metrics

__all__ = ["RM_COUNTS", "PendingReward", "compute_reward", "compute_rm_scores"]

RM_COUNTS = ("reward_model/truncated", "reward_model/judge_failures", "reward_model/judge_overlong")
_TENSORS = ["input_ids", "attention_mask", "responses", "response_mask"]
_NON_TENSORS = ["raw_prompt", "reward_model"]   # the chat (re-rendering, {prompt}); ground truth ({ground_truth})


def compute_rm_scores(batch: DataProto, reward_model=None) -> tuple[dict, dict]:
    """The model-based score, stored in the batch as `rm_scores` [B, R]: (reward-model metrics, worker metrics as
    lists per rank); nothing without a reward model."""
    if reward_model is None:
        return {}, {}
    inputs = batch.select(_TENSORS, [k for k in _NON_TENSORS if k in batch.non_tensor_batch])
    out = reward_model.compute_rm_score(inputs)
    worker = out.meta_info.pop("metrics", {})
    rm_metrics = {k: float(sum(worker.pop(k))) for k in RM_COUNTS if k in worker}
    rm_metrics.update(score_metrics(out.batch["rm_scores"].sum(-1)))
    batch.batch["rm_scores"] = out.batch["rm_scores"]
    return rm_metrics, worker


def compute_reward(batch: DataProto, reward_fn, reward_model=None) -> tuple[dict, dict, dict]:
    """(reward_fn's result, reward-model metrics, worker metrics as lists per rank). With a reward model the
    batch gains `rm_scores` [B, R] before reward_fn reads it."""
    rm_metrics, worker = compute_rm_scores(batch, reward_model)
    return reward_fn(batch), rm_metrics, worker


class PendingReward:
    """reward_model.launch_reward_fn_async: `reward_fn` scoring `batch` in a driver thread, started at once; `result()`
    waits for it. The thread reads a snapshot of the batch's key tables (the same tensors), so the passes that add
    keys to the batch meanwhile never change a table it reads."""

    def __init__(self, reward_fn, batch: DataProto):
        from concurrent.futures import ThreadPoolExecutor

        snapshot = batch.select()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-fn")
        self._future = self._pool.submit(self._timed, reward_fn, snapshot)

    @staticmethod
    def _timed(reward_fn, batch: DataProto) -> tuple[dict, float]:
        start = time.perf_counter()
        return reward_fn(batch), time.perf_counter() - start

    def result(self) -> tuple[dict, float, float]:
        """(the reward function's result, seconds it scored, seconds the caller waited for it)."""
        start = time.perf_counter()
        try:
            result, seconds = self._future.result()
        finally:
            self._pool.shutdown(wait=False)
        return result, seconds, time.perf_counter() - start
