"""Driver-side helpers of the fit loop: token balancing across DP ranks, and the rollout/actor probability check."""

import math

import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo_trainer import balance_batch, need_critic, need_reference, rollout_probs_diff


def batch_with_lengths(lengths, width=10):
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return DataProto({"attention_mask": mask, "row": torch.arange(len(lengths))})


def test_balance_batch_is_a_permutation_with_balanced_contiguous_partitions():
    lengths = [10, 9, 8, 7, 1, 1, 2, 2]  # split as given: 34 tokens on rank 0, 6 on rank 1
    batch = batch_with_lengths(lengths)
    metrics = balance_batch(batch, world_size=2)
    rows = batch.batch["row"].tolist()
    assert sorted(rows) == list(range(8))  # nothing dropped or duplicated
    loads = [sum(lengths[r] for r in rows[:4]), sum(lengths[r] for r in rows[4:])]
    assert loads == [20, 20]  # the first half goes to rank 0, the second to rank 1 (contiguous dispatch)
    assert metrics["training/seqlen_balance_max_over_min"] == 1.0
    assert {k: v for k, v in metrics.items() if k.startswith("global_seqlen/")} == {   # verl's names
        "global_seqlen/min": 6, "global_seqlen/max": 34, "global_seqlen/minmax_diff": 28, "global_seqlen/mean": 20,
        "global_seqlen/balanced_min": 20, "global_seqlen/balanced_max": 20}


def test_balance_batch_leaves_indivisible_batches_alone():
    batch = batch_with_lengths([3, 1, 2])
    assert balance_batch(batch, world_size=2) == {}
    assert batch.batch["row"].tolist() == [0, 1, 2]


def test_rollout_probs_diff_measures_masked_tokens_only():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.3, 0.3]]))
    rollout = torch.log(torch.tensor([[0.5, 0.4, 0.1], [0.25, 0.3, 0.9]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])  # the third column is padding and differs wildly
    got = rollout_probs_diff(DataProto({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}))
    assert math.isclose(got["training/rollout_probs_diff_mean"], (0 + 0.1 + 0.05 + 0) / 4, rel_tol=1e-5)
    assert math.isclose(got["training/rollout_probs_diff_max"], 0.1, rel_tol=1e-5)
    assert rollout_probs_diff(DataProto({"old_log_probs": old, "response_mask": mask})) == {}


def test_roles_follow_the_algorithm():
    from hybridrl.config.loader import load_config

    grpo = load_config(overrides=["actor_rollout_ref.rollout.n=4"])
    assert not need_critic(grpo) and not need_reference(grpo)
    ppo_kl = load_config(overrides=["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true"])
    assert need_critic(ppo_kl) and need_reference(ppo_kl)


def test_balance_batch_moves_whole_groups_when_prompts_are_shared():
    lengths = [10, 9, 1, 1, 8, 7, 2, 2]          # groups of 2 adjacent rows: 19, 2, 15, 4 tokens
    batch = batch_with_lengths(lengths)
    metrics = balance_batch(batch, world_size=2, group_size=2)
    rows = batch.batch["row"].tolist()
    assert sorted(rows) == list(range(8))
    assert all(rows[i] // 2 == rows[i + 1] // 2 and rows[i] % 2 == 0 for i in range(0, 8, 2))  # groups intact
    assert math.isclose(metrics["training/seqlen_balance_max_over_min"], 21 / 19)
    odd = batch_with_lengths([3, 1, 2, 2, 5, 5])     # 3 groups over 2 ranks: left as it is
    assert balance_batch(odd, world_size=2, group_size=2) == {} and odd.batch["row"].tolist() == list(range(6))


def test_reward_extras_become_the_rollout_dumps_columns():
    """The scorer's per-sample extras (kept in the batch as dicts) are written as verl writes them: a column each,
    None where a sample's scorer reported no such key."""
    from hybridrl.trainer.ppo_trainer import _columns

    rows = [{"acc": True, "pred": "4"}, {"acc": False}, {}]
    assert _columns(rows) == {"acc": [True, False, None], "pred": ["4", None, None]}
    assert _columns(()) == {}
