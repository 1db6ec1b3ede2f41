"""How the driver joins a rollout to its prompt batch: the part of a prompt batch the rollout reads, one group id per
prompt, the prompt rows matched to their samples, and the rollout-vs-trainer probability check."""

from __future__ import annotations

import uuid

import numpy as np

from hybridrl.algorithms.rollout_correction import apply_rollout_correction
from hybridrl.protocol import DataProto

GEN_KEYS = ["input_ids", "attention_mask", "position_ids"]
# what the rollout reads of a prompt (an agent loop sees the row: messages, data source, ground truth, extra info;
# the uid goes out with each sample, branches included, so attach_rollout finds its prompt)
GEN_NON_TENSOR_KEYS = ["raw_prompt_ids", "interaction_kwargs", "raw_prompt", "data_source", "reward_model",
                       "extra_info", "uid"]


def generation_inputs(batch: DataProto) -> DataProto:
    """The part of a prompt batch the rollout reads: the prompt tensors and those of GEN_NON_TENSOR_KEYS present."""
    return batch.select(GEN_KEYS, [k for k in GEN_NON_TENSOR_KEYS if k in batch.non_tensor_batch])


def assign_uids(batch: DataProto) -> None:
    """One group id per prompt; `repeat` copies it to the prompt's n samples (GRPO/RLOO group by it)."""
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)


def attach_rollout(batch: DataProto, out: DataProto, n: int, by_uid: bool = False) -> DataProto:
    """Prompt rows × their samples (adjacent), with the prompt-only tensors replaced by the full sequences of `out`.
    n per prompt in the batch's order, or, where an agent loop forked branches or `by_uid` (some prompts' groups, in
    any order), as many as `out` holds under each prompt's uid."""
    if not by_uid and (len(out) == n * len(batch) or "uid" not in out.non_tensor_batch):
        batch = batch.repeat(n, interleave=True)
    else:
        row = {uid: i for i, uid in enumerate(batch.non_tensor_batch["uid"])}
        batch = batch.select_idxs(np.array([row[uid] for uid in out.non_tensor_batch["uid"]]))
    for k in GEN_KEYS:
        batch.batch.pop(k)
    return batch.union(out)


def rollout_probs_diff(batch: DataProto) -> dict:
    """verl's check that the engine and the actor agree: |p_rollout - p_actor| per response token. A large value
    means the rollout sampled from a different distribution than the one being trained (weights, temperature,
    numerics), which silently turns on-policy PPO/GRPO off-policy."""
    if "rollout_log_probs" not in batch.batch:
        return {}
    mask = batch.batch["response_mask"].bool()
    diff = (batch.batch["rollout_log_probs"].float().exp() - batch.batch["old_log_probs"].float().exp()).abs()[mask]
    if diff.numel() == 0:
        return {}
    return {"training/rollout_probs_diff_mean": diff.mean().item(), "training/rollout_probs_diff_max": diff.max().item()}


def own_log_prob_metrics(batch: DataProto, own_log_probs, rc) -> dict:
    """The rollout-vs-trainer metrics (`training/rollout_probs_diff_*`, `rollout_corr/*`) over the whole batch from
    the log-probs the update computed itself (no old-log-prob pass); the trained batch is left as it is (a rejection
    criterion here only counts: the update applied it per micro-batch)."""
    if "rollout_log_probs" not in batch.batch:
        return {}
    view = batch.select(["response_mask", "rollout_log_probs"])
    view.batch["old_log_probs"] = own_log_probs
    return {**rollout_probs_diff(view), **apply_rollout_correction(view, rc)}
