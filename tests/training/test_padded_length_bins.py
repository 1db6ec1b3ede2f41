"""Micro-batches of a padded forward (the reward model's with use_dynamic_bsz): rows sorted by length, each
micro-batch within the budget counted padded, every row once, as many micro-batches as another rank needs."""

import random

import pytest

from hybridrl.training import token_bins
from hybridrl.training.token_bins import padded_length_bins


@pytest.mark.parametrize("seed", range(5))
def test_bins_cover_every_row_once_within_the_padded_budget(seed):
    rnd = random.Random(seed)
    lens = [rnd.choice([rnd.randint(1, 50), rnd.randint(200, 400)]) for _ in range(rnd.randint(1, 60))]
    budget = max(lens) * rnd.choice([1, 2, 5])
    bins = padded_length_bins(lens, budget)
    assert sorted(i for b in bins for i in b) == list(range(len(lens)))
    assert all(b == sorted(b) for b in bins)
    for b in bins:
        assert len(b) * max(lens[i] for i in b) <= budget
    # cut in length order: no length of a later micro-batch exceeds one of an earlier micro-batch
    spans = [(min(lens[i] for i in b), max(lens[i] for i in b)) for b in bins]
    assert all(lo >= next_hi for (lo, _), (_, next_hi) in zip(spans, spans[1:]))


def test_fewer_forwards_than_input_order_chunks_on_long_tailed_lengths():
    lens = [4000 if i % 8 == 0 else 100 for i in range(64)]   # one long input in every 8
    bins = padded_length_bins(lens, 8000)
    padded = sum(len(b) * max(lens[i] for i in b) for b in bins)
    # fixed rows in input order: 2 rows a forward keep a long input's pair within 8000 tokens
    in_order = sum(2 * max(lens[i:i + 2]) for i in range(0, 64, 2))
    assert len(bins) == 4 + 1 and (padded, in_order) == (4 * 8000 + 56 * 100, 8 * 8000 + 24 * 200)


def test_another_ranks_count_splits_the_widest_micro_batch(monkeypatch):
    monkeypatch.setattr(token_bins, "_agreed_count", lambda num, group: 4)
    bins = padded_length_bins([10, 10, 10, 10, 10, 10], 60)
    assert len(bins) == 4 and sorted(i for b in bins for i in b) == list(range(6))
    monkeypatch.setattr(token_bins, "_agreed_count", lambda num, group: 7)
    with pytest.raises(RuntimeError, match="another rank needs 7 micro-batches but this rank has only 6 rows; "
                                           "raise reward_model.forward_max_token_len_per_gpu"):
        padded_length_bins([10] * 6, 60, key="reward_model.forward_max_token_len_per_gpu")


def test_a_budget_below_the_longest_input_names_the_key():
    with pytest.raises(ValueError, match="reward_model.forward_max_token_len_per_gpu=99 is smaller than a sequence "
                                         "of 100 tokens"):
        padded_length_bins([5, 100], 99, key="reward_model.forward_max_token_len_per_gpu")
