"""Token budgets are per GPU, as verl's *_max_token_len_per_gpu: with Ulysses a micro-batch holds the budget times
the group's size (each rank runs 1/size of its tokens)."""

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.training.micro_batches import make_micro_batches


def _rows(lengths, width=16):
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return DataProto.from_dict({"attention_mask": mask, "row": torch.arange(len(lengths))})


def test_a_ulysses_group_packs_budget_times_its_size():
    data = _rows([10, 10, 10, 10])
    alone, _ = make_micro_batches(data, True, None, 20)
    assert [len(m) for m in alone] == [2, 2]
    group, _ = make_micro_batches(data, True, None, 20, sp_size=2)
    assert [len(m) for m in group] == [4]
    with pytest.raises(ValueError, match=r"ppo_max_token_len_per_gpu x ulysses size 2"):
        make_micro_batches(_rows([16]), True, None, 7, sp_size=2)   # 16 tokens > 7 x 2
    assert len(make_micro_batches(_rows([14]), True, None, 7, sp_size=2)[0]) == 1
