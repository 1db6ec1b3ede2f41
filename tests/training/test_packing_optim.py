"""Pure helpers: token-balanced micro-batches and order restore, packing indices, lr schedules, merge CLI."""

import argparse

import pytest
import torch
from typed_sections import optim_section

from hybridrl.training.optim import build_lr_scheduler, build_optimizer
from hybridrl.training.packing import pack_inputs
from hybridrl.training.token_bins import rearrange_micro_batches, restore_order


def test_rearrange_micro_batches_respects_budget_and_restores_order():
    lens = [7, 3, 9, 2, 5, 8, 1]
    bins = rearrange_micro_batches(lens, max_token_len=12)
    assert sorted(i for b in bins for i in b) == list(range(len(lens)))
    assert all(sum(lens[i] for i in b) <= 12 for b in bins)
    assert len(bins) == 3          # ceil(35 / 12) bins, and longest-first balancing fits them
    rows = torch.arange(len(lens)).float()[:, None]
    chunks = [rows[torch.tensor(b)] for b in bins]
    assert torch.equal(restore_order(chunks, bins), rows)
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=8"):
        rearrange_micro_batches(lens, max_token_len=8)


def test_pack_inputs_keeps_valid_tokens_and_restarting_positions():
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    packed = pack_inputs(ids, mask, pos)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert packed.cu_seqlens.tolist() == [0, 3, 5] and packed.max_seqlen == 3


def _lrs(values, steps):
    cfg = optim_section(**values)
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    sched = build_lr_scheduler(opt, cfg)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_lr_schedules_warmup_constant_and_cosine():
    const = _lrs({"lr": 1.0, "lr_warmup_steps": 2, "warmup_style": "constant"}, 4)
    assert const == pytest.approx([0.0, 0.5, 1.0, 1.0])
    cos = _lrs({"lr": 1.0, "lr_warmup_steps_ratio": 0.2, "warmup_style": "cosine", "min_lr_ratio": 0.1,
                "total_training_steps": 10}, 11)
    assert cos[:2] == pytest.approx([0.0, 0.5]) and cos[2] == pytest.approx(1.0)
    assert cos[10] == pytest.approx(0.1) and all(a >= b for a, b in zip(cos[2:], cos[3:]))
    with pytest.raises(ValueError, match="total_training_steps"):
        _lrs({"lr": 1.0, "warmup_style": "cosine"}, 1)
    with pytest.raises(ValueError, match="warmup_style"):
        _lrs({"lr": 1.0, "warmup_style": "linear"}, 1)


def test_merge_and_sft_register_subcommands(tmp_path):
    from hybridrl.trainer.sft_trainer import register as register_sft
    from hybridrl.training.merge import merge_checkpoint, register

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register(sub)
    register_sft(sub)
    args = parser.parse_args(["merge", "a", "b", "--dtype", "float32"])
    assert (args.ckpt_dir, args.out_dir, args.dtype) == ("a", "b", "float32") and callable(args.func)
    assert parser.parse_args(["sft", "optim.lr=1e-4"]).overrides == ["optim.lr=1e-4"]
    with pytest.raises(FileNotFoundError, match="model"):
        merge_checkpoint(tmp_path, tmp_path / "out")
