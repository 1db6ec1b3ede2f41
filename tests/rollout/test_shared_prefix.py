"""Cascade attention for decode: the prefix groups read off block tables (pure Python), and the Triton kernels with
shared prefixes against the torch reference, on CPU under the Triton interpreter (TRITON_INTERPRET=1) and on a GPU."""

import os

import pytest
import torch

from hybridrl.rollout.attention import paged_decode_reference
from hybridrl.rollout.shared_prefix import (
    MIN_PREFIX_TOKENS,
    SharedPrefix,
    find_prefix_groups,
    prefix_members,
    use_cascade,
)


def test_groups_are_runs_of_rows_sharing_leading_blocks_up_to_the_first_difference():
    bs = 16
    prompt = list(range(100, 116))                         # 16 shared blocks = 256 tokens
    tables = [prompt + [200 + r] for r in range(3)]        # 3 samples, own block 17 each
    tables += [[7, 8, 9, 10, 11], [7, 8, 9, 10, 12]]       # 4 shared blocks (64 tokens), then they differ
    tables += [[1, 2, 3, 4, 5]]                            # alone
    tables += [prompt[:3] + [300, 301, 302]]               # shares 3 blocks with the first rows, not consecutive
    lens = [260, 300, 257, 70, 66, 80, 96]
    found = find_prefix_groups(tables, lens, bs, members=8)
    assert found.groups == [(0, 3), (3, 2)]
    assert found.lens == [256, 256, 256, 64, 64, 0, 0]
    assert found.saved_tokens == found.repeated_tokens == 2 * 256 + 64


def test_prefix_stops_before_each_rows_last_token_and_short_prefixes_are_left_alone():
    bs = 16
    shared = list(range(10, 20))
    tables = [shared + [50], shared + [51]]
    # row 1's context ends inside block 5 (position 79 is its last token): blocks 0-3 only
    found = find_prefix_groups(tables, [170, 80], bs, members=8)
    assert found.lens == [64, 64] and found.groups == [(0, 2)]
    found = find_prefix_groups(tables, [170, 64], bs, members=8)        # 3 full blocks before the last token
    assert 3 * bs < MIN_PREFIX_TOKENS and found.groups == [] and found.lens == [0, 0]
    assert found.saved_tokens == 0 and found.repeated_tokens == 3 * bs   # the floor still counts them once


@pytest.mark.parametrize("rows,members,parts", [(9, 8, [5, 4]), (16, 8, [8, 8]), (3, 2, [2]), (5, 2, [2, 2])])
def test_long_runs_are_cut_into_parts_of_at_most_members_rows_and_never_one(rows, members, parts):
    tables = [[1, 2, 3, 4, 5, 6] for _ in range(rows)]
    found = find_prefix_groups(tables, [90] * rows, 16, members)
    assert [c for _, c in found.groups] == parts
    assert sum(found.lens) == 80 * sum(parts)
    assert len(found.groups) <= rows // 2
    assert found.saved_tokens == sum((c - 1) * 80 for c in parts)


def test_members_per_program_fit_one_tile_and_single_member_groups_are_never_made():
    assert prefix_members(6) == 10 and prefix_members(7) == 9 and prefix_members(1) == 16
    assert prefix_members(71) == 1
    found = find_prefix_groups([[1, 2, 3, 4, 5]] * 4, [80] * 4, 16, members=prefix_members(71))
    assert found.groups == [] and found.saved_tokens == 0 and found.repeated_tokens == 3 * 64


def test_cascade_is_used_only_where_the_prefixes_outgrow_the_l2_share():
    found = find_prefix_groups([list(range(16)) + [99 + r, 199 + r] for r in range(8)] +
                               [list(range(30, 38)) + [299 + r] for r in range(3)], [300] * 8 + [140] * 3, 16,
                               members=8)
    assert found.groups == [(0, 8), (8, 3)]
    prefix_bytes = (256 + 128) * 1024
    assert use_cascade(found, kv_bytes_per_token=1024, l2_bytes=2 * prefix_bytes, min_l2_fraction=0.5)
    assert not use_cascade(found, kv_bytes_per_token=1024, l2_bytes=2 * prefix_bytes + 2, min_l2_fraction=0.5)
    assert not use_cascade(find_prefix_groups([[1]], [2], 16, 8), 1 << 20, l2_bytes=0)


def _cascade_case(device, dtype, B_groups, n, prefix_blocks, N, K, D, page=16, seed=0):
    """Random K/V; `B_groups` groups of `n` rows sharing `prefix_blocks` leading blocks, then own blocks; lengths from
    just past the prefix to several own blocks; a few rows that share nothing at the end."""
    g = torch.Generator().manual_seed(seed)
    own_max = 9
    width = prefix_blocks + own_max
    rows = B_groups * n + 3
    NB = B_groups * prefix_blocks + rows * width + 4
    perm = torch.randperm(NB, generator=g).tolist()
    tables, lens = [], []
    for _ in range(B_groups):
        shared = [perm.pop() for _ in range(prefix_blocks)]
        for _ in range(n):
            own = [perm.pop() for _ in range(own_max)]
            tables.append(shared + own)
            lens.append(prefix_blocks * page + 1 + int(torch.randint(0, own_max * page - 1, (1,), generator=g)))
    for _ in range(3):
        tables.append([perm.pop() for _ in range(width)])
        lens.append(int(torch.randint(1, width * page, (1,), generator=g)))
    q = torch.randn(rows, N, D, generator=g).to(device, dtype)
    kc = torch.randn(NB, page, K, D, generator=g).to(device, dtype)
    vc = torch.randn(NB, page, K, D, generator=g).to(device, dtype)
    bt = torch.tensor(tables, dtype=torch.int32, device=device)
    cl = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, kc, vc, bt, cl, tables, lens


def _run_cascade(q, kc, vc, bt, cl, tables, lens, num_splits=None):
    from hybridrl.rollout.triton_decode import paged_decode_triton

    B, N, _ = q.shape
    found = find_prefix_groups(tables, lens, kc.shape[1], prefix_members(N // kc.shape[2]))
    assert found.groups, "the case must hold prefix groups"
    G = max(1, B // 2)
    first = torch.zeros(G, dtype=torch.long)
    count = torch.zeros(G, dtype=torch.long)
    for i, (f, c) in enumerate(found.groups):
        first[i], count[i] = f, c
    prefix = SharedPrefix(torch.tensor(found.lens, device=q.device), first.to(q.device), count.to(q.device))
    return paged_decode_triton(q, kc, vc, bt, cl, q.shape[-1] ** -0.5, num_splits=num_splits, prefix=prefix)


interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the kernels run on CPU only under the Triton interpreter: TRITON_INTERPRET=1")


@interpreted
@pytest.mark.parametrize("N,K,D,n,splits,prefix_blocks", [(12, 2, 32, 8, 1, 5), (12, 2, 32, 11, 3, 5),
                                                          (4, 4, 16, 3, None, 5), (8, 1, 16, 20, 2, 5),
                                                          (12, 2, 32, 8, 1, 41), (4, 2, 16, 5, 3, 80)])
def test_cascade_kernels_match_the_reference_interpreted(N, K, D, n, splits, prefix_blocks):
    """Prefixes of 80 tokens (one chunk), 656 (three: the last partial) and 1,280 (four, the most)."""
    pytest.importorskip("triton")
    case = _cascade_case("cpu", torch.float32, B_groups=2, n=n, prefix_blocks=prefix_blocks, N=N, K=K, D=D)
    q, kc, vc, bt, cl = case[:5]
    ref = paged_decode_reference(q, kc, vc, bt, cl, D ** -0.5)
    got = _run_cascade(*case, num_splits=splits)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("N,K,D,n", [(12, 2, 128, 8), (28, 4, 128, 16), (14, 2, 64, 5), (32, 8, 128, 8)])
@pytest.mark.parametrize("splits", [None, 1])
def test_cascade_kernels_match_the_reference_bf16(N, K, D, n, splits):
    case = _cascade_case("cuda", torch.bfloat16, B_groups=5, n=n, prefix_blocks=17, N=N, K=K, D=D)
    q, kc, vc, bt, cl = case[:5]
    ref = paged_decode_reference(q, kc, vc, bt, cl, D ** -0.5)
    got = _run_cascade(*case, num_splits=splits)
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=2e-2)


def _cascade_engine_outputs(model, device, cascade: bool, monkeypatch, **kw):
    """Greedy samples of prompts whose n samples share 2-5 full blocks, every decode step with cascade attention
    (no saving too small) or none; the engine's count of cascade steps."""
    from rollout_helpers import make_engine

    from hybridrl.rollout import shared_prefix
    from hybridrl.rollout.sampling_params import SamplingParams

    monkeypatch.setattr(shared_prefix, "MIN_L2_FRACTION", 0.0)
    monkeypatch.setattr(shared_prefix, "MIN_PREFIX_TOKENS", 16)
    monkeypatch.setenv("HYBRIDRL_CASCADE", "1" if cascade else "0")
    engine = make_engine(model, **kw) if device == "cpu" else _cuda_engine(model, **kw)
    prompts = [list(range(3, 40)), [9] * 20 + [4, 5, 6], list(range(50, 130))]
    outs = engine.generate(prompts, SamplingParams(n=4, temperature=0, max_tokens=12, ignore_eos=True))
    return [[c.token_ids for c in o.outputs] for o in outs], engine.stats["num_cascade_steps"]


def _cuda_engine(model, **kw):
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine

    engine = LLMEngine(model.config, EngineConfig(**{"dtype": torch.float32, "block_size": 8, "max_num_seqs": 64,
                                                     "max_num_batched_tokens": 512, **kw}), device="cuda")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    engine.wake_up(("kv_cache",))
    return engine


@interpreted
def test_engine_decodes_the_same_tokens_with_cascade_attention_interpreted(monkeypatch):
    """The CPU engine with the Triton decode kernels forced on (interpreted): cascade steps give the same greedy
    tokens as the torch reference path."""
    pytest.importorskip("triton")
    from rollout_helpers import tiny_hf_model

    from hybridrl.rollout import model_runner

    model = tiny_hf_model("qwen2")
    ref, steps_off = _cascade_engine_outputs(model, "cpu", False, monkeypatch, block_size=8)
    monkeypatch.setattr(model_runner, "_triton_available", lambda device: True)
    got, steps_on = _cascade_engine_outputs(model, "cpu", True, monkeypatch, block_size=8)
    assert steps_off == 0 and steps_on > 0
    assert got == ref


@pytest.mark.gpu
@pytest.mark.parametrize("enforce_eager,async_scheduling", [(True, False), (False, False), (False, True)])
def test_engine_decodes_the_same_tokens_with_cascade_attention_on_cuda(enforce_eager, async_scheduling, monkeypatch):
    from rollout_helpers import tiny_hf_model

    model = tiny_hf_model("qwen2").cuda()
    kw = dict(enforce_eager=enforce_eager, async_scheduling=async_scheduling)
    ref, steps_off = _cascade_engine_outputs(model, "cuda", False, monkeypatch, **kw)
    got, steps_on = _cascade_engine_outputs(model, "cuda", True, monkeypatch, **kw)
    assert steps_off == 0 and steps_on > 0
    assert got == ref


def test_runner_recomputes_the_groups_only_when_a_table_is_replaced_or_blocks_are_copied(monkeypatch):
    """The runner's per-step prefix groups and cascade decision (CPU engine, the Triton kernels not needed): groups
    written into the step's meta rows, reused while every row keeps its block-table list (blocks appended in place
    move no prefix), recomputed when a row's list is replaced or blocks were copied on write; none for a verify
    step; with the cascade off they are still found where the step's floor counts shared blocks once."""
    from types import SimpleNamespace

    import numpy as np
    from rollout_helpers import make_engine, tiny_hf_model

    from hybridrl.rollout import model_runner, shared_prefix

    monkeypatch.setattr(shared_prefix, "MIN_L2_FRACTION", 0.0)
    runner = make_engine(tiny_hf_model("qwen2"), block_size=4).runner
    runner.cascade_members = 8
    calls = []
    real = model_runner.find_prefix_groups
    monkeypatch.setattr(model_runner, "find_prefix_groups", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt = list(range(100, 116))          # 16 blocks of 4 = 64 tokens, shared by rows 0-2
    seqs = [SimpleNamespace(block_table=prompt + [200 + r]) for r in range(3)]
    seqs.append(SimpleNamespace(block_table=[1, 2, 3]))
    lens = [66, 66, 66, 10]
    batch = SimpleNamespace(drafts=None, block_copies=[])
    meta = np.full((8, 8), -1, dtype=np.int64)

    def step(b=batch):
        return runner._cascade(runner._prefix_groups(b, seqs, lens), len(seqs), meta, rows=8)

    assert step()
    assert list(meta[5]) == [64, 64, 64, 0, 0, 0, 0, 0]
    assert list(meta[6, :4]) == [0, 0, 0, 0] and list(meta[7, :4]) == [3, 0, 0, 0]
    assert runner._prefix.repeated_tokens == 2 * 64
    assert step() and len(calls) == 1
    seqs[1].block_table.append(300)          # a new block for the sequence's next tokens: same list
    assert step() and len(calls) == 1
    seqs[2].block_table = [900 + i for i in range(17)]   # re-admitted elsewhere: a new list, shares nothing now
    assert step() and len(calls) == 2
    assert list(meta[5, :4]) == [64, 64, 0, 0] and list(meta[7, :2]) == [2, 0]
    assert step(SimpleNamespace(drafts=None, block_copies=[(5, 6)])) and len(calls) == 3
    assert runner._prefix_groups(SimpleNamespace(drafts=[[1]] * 4, block_copies=[]), seqs, lens) is None
    monkeypatch.setattr(shared_prefix, "MIN_L2_FRACTION", 1.0)
    runner._l2_bytes = 1 << 40               # prefixes far below the L2 size: the per-row kernel
    assert not step()
    runner.cascade_members = 0               # cascade off, no floor (CPU): nothing to find
    assert runner._prefix_groups(batch, seqs, lens) is None
    runner.decode_step_floor_s = lambda context: context * 1e-9   # a GPU with known peaks: found for the floor
    found = runner._prefix_groups(batch, seqs, lens)
    assert found.repeated_tokens == 64 and not runner._cascade(found, len(seqs), meta, rows=8)


def test_the_decode_floor_reads_a_shared_prompt_once_per_step(monkeypatch):
    """With the runner's floor on (a GPU's, stubbed here as one second per token), a step counts each prompt's
    shared full blocks once: 2 prompts x 4 samples of 37 tokens (9 full blocks of 4 shared, the partial one copied
    on write) save 2 x 3 x 36 tokens a step against the same run without prompt sharing, over its 11 decode steps."""
    from rollout_helpers import make_engine, tiny_hf_model

    from hybridrl.rollout import model_runner
    from hybridrl.rollout.sampling_params import SamplingParams

    monkeypatch.setattr(model_runner.ModelRunner, "_decode_floor_fn", lambda self: (lambda tokens: float(tokens)))
    model = tiny_hf_model("qwen2")
    floors = {}
    for sharing in (True, False):
        engine = make_engine(model, block_size=4, enable_prefix_sharing=sharing)
        engine.generate([list(range(3, 40)), list(range(50, 87))],
                        SamplingParams(n=4, temperature=0, max_tokens=12, ignore_eos=True))
        assert engine.stats["num_decode_steps"] == 11
        floors[sharing] = engine.stats["decode_floor_s"]
    assert floors[False] - floors[True] == 11 * 2 * 3 * 36
