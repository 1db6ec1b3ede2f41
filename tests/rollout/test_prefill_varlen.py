"""Prefill over cached tokens and mixed lengths as one varlen call per run of sequences (rollout/attention.py):
the runs and their key slots on CPU (a torch stand-in for the kernel), FlashAttention itself on CUDA."""

from concurrent.futures import Future

import numpy as np
import pytest
import torch
from rollout_helpers import make_engine, tiny_hf_model

import hybridrl.rollout.attention as attention
from hybridrl.models.varlen_attention import flash_available
from hybridrl.rollout.attention import AttentionContext, prefill_chunks, sdpa_gqa
from hybridrl.rollout.multi_turn import TurnOutcome
from hybridrl.rollout.sampling_params import BUDGET, Continuation, SamplingParams


def varlen_reference(q_TND, k_SKD, v_SKD, cu_q, cu_k, max_q, max_k, scale):
    """The kernel's contract in plain torch: per segment, query i of n sees keys 0 .. m - n + i of its m."""
    outs = []
    for i in range(len(cu_q) - 1):
        q = q_TND[cu_q[i]:cu_q[i + 1]].transpose(0, 1)[None]
        k, v = (x[cu_k[i]:cu_k[i + 1]].transpose(0, 1)[None] for x in (k_SKD, v_SKD))
        n, m = q.shape[2], k.shape[2]
        assert n <= max_q and m <= max_k
        mask = torch.arange(m)[None, :] <= (m - n + torch.arange(n))[:, None]
        outs.append(sdpa_gqa(q, k, v, scale, mask=mask)[0].transpose(0, 1))
    return torch.cat(outs, 0)


def test_runs_keep_their_keys_within_the_cap_and_list_every_position():
    lens, cached = [3, 5, 2, 4], [10, 0, 7, 1]
    slots = [np.arange(c + n) + 100 * i for i, (n, c) in enumerate(zip(lens, cached))]
    chunks = prefill_chunks(lens, cached, slots, cap=16, device="cpu")
    # keys 13 | 5 + 9 = 14 | 5: a run closes before its keys would pass 16; a sequence over the cap is a run alone
    assert [(c.q_lo, c.q_hi) for c in chunks] == [(0, 3), (3, 10), (10, 14)]
    assert [c.cu_k.tolist() for c in chunks] == [[0, 13], [0, 5, 14], [0, 5]]
    assert chunks[1].cu_q.tolist() == [0, 5, 7] and (chunks[1].max_q, chunks[1].max_k) == (5, 9)
    assert chunks[1].key_slots.tolist() == slots[1].tolist() + slots[2].tolist()
    assert len(prefill_chunks(lens, cached, slots, cap=8, device="cpu")) == 4


class InjectingAgent:
    """Ends each assistant turn after 3 tokens and appends two fixed tokens at once, three turns: every resumed turn
    is a prefill over the trajectory's cached tokens."""

    def ends_turn(self, seq):
        return len(seq) - seq.turn_start >= 3

    def on_turn_end(self, seq, budget):
        seq.agent_state = (seq.agent_state or 0) + 1
        future = Future()
        future.set_result(TurnOutcome(None, "stop") if seq.agent_state >= 3 else TurnOutcome([5, 6]))
        return future

    def trajectory_stats(self, seq):
        return {}


PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 11, [3, 1, 4, 1, 5, 9, 2, 6]]


def mixed_lengths_and_continuations(engine):
    params = SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True, token_budget=5)
    first = engine.generate(PROMPTS, params)
    assert all(c.finish_reason == BUDGET for o in first for c in o.outputs)
    conts = [Continuation(p, c.token_ids, c.logprobs) for p, o in zip(PROMPTS, first) for c in o.outputs]
    rest = engine.generate([], params, continuations=conts)
    return [c.token_ids for o in first for c in o.outputs] + [o.outputs[0].token_ids for o in rest]


def multi_turn(engine):
    outs = engine.generate(PROMPTS, SamplingParams(n=3, temperature=0, max_tokens=16, ignore_eos=True),
                           agent=InjectingAgent())
    return [(c.token_ids, c.response_mask) for o in outs for c in o.outputs]


@pytest.mark.parametrize("workload,cap", [(mixed_lengths_and_continuations, 256), (multi_turn, 32)])
def test_varlen_prefill_gives_the_per_sequence_path_tokens(monkeypatch, workload, cap):
    """Greedy: the varlen path (kernel replaced by its torch contract) gives the per-sequence path's tokens — for
    prompts of mixed lengths and continued samples in one run per step, and for resumed turns (prefills over
    cached tokens) split in runs by a small token budget."""
    model = tiny_hf_model("qwen2")
    results, segments = [], []

    def stand_in(*args):
        segments.append(args[3].numel() - 1)
        return varlen_reference(*args)

    monkeypatch.setattr(attention, "varlen_causal_attention", stand_in)
    for varlen in (False, True):
        engine = make_engine(model, max_num_batched_tokens=cap, max_model_len=cap)
        engine.runner.prefill_varlen = varlen
        results.append(workload(engine))
    assert results[0] == results[1]
    assert segments and max(segments) > 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_prefill_over_cached_keys_matches_the_per_sequence_path(dtype):
    dev = torch.device("cuda")
    assert flash_available(dev, dtype, 128)
    torch.manual_seed(0)
    N, K, D, bs, blocks = 8, 2, 128, 16, 512
    cache = torch.randn(2, blocks, bs, K, D, device=dev, dtype=dtype)
    lens, cached = [7, 130, 1, 64, 33], [0, 500, 2000, 15, 0]
    perm = torch.randperm(blocks).tolist()
    tables, slots, key_slots, start = [], [], [], 0
    for n, c in zip(lens, cached):
        need = -(-(n + c) // bs)
        table, start = perm[start:start + need], start + need
        p = np.arange(n + c)
        keys = np.asarray(table)[p // bs] * bs + p % bs
        tables.append(torch.tensor(table, dtype=torch.int32, device=dev) if c else None)
        key_slots.append(keys)
        slots.append(keys[c:])
    T = sum(lens)
    q, k, v = (torch.randn(T, h, D, device=dev, dtype=dtype) for h in (N, K, K))
    slot_mapping = torch.from_numpy(np.concatenate(slots)).to(dev)
    outs = []
    for chunks in (None, prefill_chunks(lens, cached, key_slots, cap=1024, device=dev)):
        ctx = AttentionContext([cache.clone()], True, slot_mapping, seq_lens=lens, cached_lens=cached,
                               prefill_block_tables=tables, prefill_chunks=chunks)
        outs.append(ctx.attend(0, q, k, v, D ** -0.5).float())
    assert len(chunks) > 1
    torch.testing.assert_close(outs[1], outs[0], atol=2e-2, rtol=2e-2)
