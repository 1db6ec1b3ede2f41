"""DAPO dynamic sampling (algorithm.filter_groups): the metric per sample, which groups survive, collection."""

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.dynamic_sampling import (
    GroupCollector,
    filter_groups,
    merge_reward_metrics,
    sample_metric,
)


def scored(uids, scores, row0=0):
    """Rows of `uids` (a group's samples adjacent) with one score each, placed on the last of 3 positions."""
    tls = torch.zeros(len(uids), 3)
    tls[:, -1] = torch.tensor(scores, dtype=torch.float32)
    rewards = tls.clone()
    rewards[:, 0] = -0.5  # an in-reward KL penalty on the first token
    return DataProto({"token_level_scores": tls, "token_level_rewards": rewards,
                      "row": torch.arange(row0, row0 + len(uids))}, {"uid": uids})


def test_groups_with_equal_metric_are_dropped_and_single_samples_kept():
    batch = scored(["a", "a", "b", "b", "c", "c", "d"], [1, 0, 1, 1, 0, 0, 1])
    kept, n_kept, n_dropped = filter_groups(batch, np.array([1, 0, 1, 1, 0, 0, 1.0]))
    assert kept.batch["row"].tolist() == [0, 1, 6]  # a varies; b all right, c all wrong; d has one sample
    assert (n_kept, n_dropped) == (2, 2)


def test_sample_metric_names():
    batch = scored(["a", "a"], [0.5, -1.0])
    result = {"scores": [0.5, 0.0], "reward_extra_info": {"acc": [True, None]}}
    assert sample_metric(batch, "acc", result).tolist() == [1.0, 0.0]  # a sample without "acc": its score
    assert sample_metric(batch, "score", result).tolist() == [0.5, 0.0]  # the scorer's, not the reward tensor
    assert sample_metric(batch, "seq_reward", result).tolist() == [0.5, -1.0]
    assert sample_metric(batch, "seq_final_reward", result).tolist() == [0.0, -1.5]
    assert sample_metric(batch, "acc", {"scores": [0.5, 0.0]}).tolist() == [0.5, 0.0]  # plain-number scorer
    with pytest.raises(ValueError, match="filter_groups.metric='pass'"):
        sample_metric(batch, "pass", result)


def test_collector_accumulates_until_enough_groups_then_trims_the_surplus():
    c = GroupCollector(target_prompts=2, n=2, max_num_gen_batches=0)
    first = scored(["a", "a", "b", "b"], [1, 1, 0, 1], row0=0)  # only b has signal
    assert not c.add(first, first.batch["token_level_scores"].sum(-1).numpy())
    second = scored(["c", "c", "d", "d", "e", "e"], [0, 1, 1, 0, 0, 0], row0=4)  # c, d have signal
    assert c.add(second, second.batch["token_level_scores"].sum(-1).numpy())
    batch, metrics = c.batch()
    assert batch.batch["row"].tolist() == [2, 3, 4, 5]  # b then c: d is the surplus
    assert batch.non_tensor_batch["uid"].tolist() == ["b", "b", "c", "c"]
    assert metrics == {"train/num_gen_batches": 2.0, "train/filter_groups/kept": 2.0,
                       "train/filter_groups/dropped": 2.0, "train/filter_groups/trimmed": 1.0}


def test_collector_stops_at_max_num_gen_batches():
    c = GroupCollector(target_prompts=2, n=2, max_num_gen_batches=2)
    flat = scored(["a", "a"], [1, 1])
    assert not c.add(flat, np.array([1.0, 1.0]))
    with pytest.raises(RuntimeError, match=r"2 generation batches gave 0 prompt groups .*max_num_gen_batches=2"):
        c.add(flat, np.array([1.0, 1.0]))


def test_reward_metrics_of_several_generation_batches():
    merged = merge_reward_metrics([{"reward/errors": 1, "reward/samples": 4, "reward/overlong_reward_mean": -0.5},
                                   {"reward/errors": 2, "reward/samples": 12, "reward/overlong_reward_mean": -0.1}])
    assert merged["reward/errors"] == 3 and merged["reward/samples"] == 16
    assert merged["reward/overlong_reward_mean"] == pytest.approx((-0.5 * 4 - 0.1 * 12) / 16)
