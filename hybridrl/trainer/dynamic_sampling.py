"""DAPO's dynamic sampling (verl's `algorithm.filter_groups`): keep only prompt groups whose metric varies.

A group whose n samples all score the same has zero advantage under GRPO-style estimators, so it adds no
gradient, only noise in the loss normaliser. The driver drops such groups and keeps generating batches
(`data.gen_batch_size` prompts each) until `data.train_batch_size` prompts with signal are collected; the surplus
beyond it is trimmed, as verl does, so the trained batch always holds exactly train_batch_size × n rows (and
therefore divides over the data-parallel ranks like a normal step).

The metric per sample (verl's names):
- `acc`: the scorer's "acc" (dict scorers); a sample without it (a plain-number scorer, a failed sample) uses its
  score, as verl's DAPO reward manager records a plain score as "acc";
- `score`: the scorer's score, before the overlong penalty;
- `seq_reward`: the sum of token_level_scores (with the overlong penalty);
- `seq_final_reward`: the sum of token_level_rewards (after the in-reward KL penalty, when on).
A group with a single sample (rollout.n = 1) is always kept (verl: its std is 0 but there is nothing to compare).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from hybridrl.protocol import DataProto

__all__ = ["FILTER_METRICS", "GroupCollector", "filter_groups", "merge_reward_metrics", "sample_metric"]

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


def sample_metric(batch: DataProto, metric: str, reward_result: dict) -> np.ndarray:
    """The filter metric of every row of `batch` (after scoring; `reward_result` is the reward manager's output)."""
    if metric == "seq_reward":
        return batch.batch["token_level_scores"].sum(-1).numpy()
    if metric == "seq_final_reward":
        return batch.batch["token_level_rewards"].sum(-1).numpy()
    if metric not in ("acc", "score"):
        raise ValueError(f"algorithm.filter_groups.metric={metric!r}: must be one of {list(FILTER_METRICS)}")
    scores = np.asarray(reward_result["scores"], dtype=np.float64)
    if metric == "score":
        return scores
    acc = reward_result.get("reward_extra_info", {}).get("acc")
    if acc is None:
        return scores
    return np.array([s if a is None else float(a) for a, s in zip(acc, scores, strict=True)])


def filter_groups(batch: DataProto, values: np.ndarray) -> tuple[DataProto, int, int]:
    """(the rows of groups whose values vary or that have one sample, groups kept, groups dropped). Groups are
    the `uid`s; kept rows stay in their order, so the n samples of a prompt stay adjacent."""
    by_uid: dict[str, list[float]] = defaultdict(list)
    for uid, v in zip(batch.non_tensor_batch["uid"], values, strict=True):
        by_uid[uid].append(float(v))
    kept = {uid for uid, vs in by_uid.items() if len(vs) == 1 or np.std(vs) > 0}
    rows = [i for i, uid in enumerate(batch.non_tensor_batch["uid"]) if uid in kept]
    return batch.select_idxs(torch.tensor(rows, dtype=torch.long)), len(kept), len(by_uid) - len(kept)


class GroupCollector:
    """Accumulates the kept groups of successive generation batches until `target_prompts` are there."""

    def __init__(self, target_prompts: int, n: int, max_num_gen_batches: int):
        self.target, self.n, self.max_batches = target_prompts, n, max_num_gen_batches
        self.parts: list[DataProto] = []
        self.kept = self.dropped = self.num_gen_batches = 0

    def add(self, batch: DataProto, values: np.ndarray) -> bool:
        """Filter one scored generation batch; True once enough prompts are collected. Raises when another
        batch would be needed but `max_num_gen_batches` (> 0) have been generated."""
        self.num_gen_batches += 1
        kept_rows, kept, dropped = filter_groups(batch, values)
        self.kept, self.dropped = self.kept + kept, self.dropped + dropped
        if len(kept_rows):
            self.parts.append(kept_rows)
        if self.kept >= self.target:
            return True
        if 0 < self.max_batches <= self.num_gen_batches:
            raise RuntimeError(
                f"algorithm.filter_groups: {self.num_gen_batches} generation batches gave {self.kept} prompt groups "
                f"with a varying metric ({self.dropped} had none), fewer than data.train_batch_size={self.target}, "
                f"and max_num_gen_batches={self.max_batches} is reached. The data may be too hard or too easy for "
                "the model; raise max_num_gen_batches (0 = no limit) or data.gen_batch_size")
        return False

    def batch(self) -> tuple[DataProto, dict[str, float]]:
        """The first train_batch_size prompts' rows and verl's `train/num_gen_batches` with the group counts."""
        rows = self.target * self.n
        full = DataProto.concat(self.parts) if len(self.parts) > 1 else self.parts[0]
        metrics = {"train/num_gen_batches": float(self.num_gen_batches),
                   "train/filter_groups/kept": float(self.target),
                   "train/filter_groups/dropped": float(self.dropped),
                   "train/filter_groups/trimmed": float(self.kept - self.target)}
        return full.slice(0, rows), metrics


def merge_reward_metrics(parts: list[dict]) -> dict:
    """The reward manager's metrics of several generation batches as one: counts summed, `*_mean` values weighted
    by each batch's `reward/samples`."""
    if len(parts) == 1:
        return dict(parts[0])
    total = sum(p.get("reward/samples", 0) for p in parts)
    merged: dict = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        if key.endswith("_mean"):
            merged[key] = sum(p.get(key, 0.0) * p.get("reward/samples", 0) for p in parts) / max(1, total)
        else:
            merged[key] = sum(p.get(key, 0) for p in parts)
    return merged
