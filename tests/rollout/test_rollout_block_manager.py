"""BlockManager and Scheduler bookkeeping (pure Python)."""

import pytest

from hybridrl.rollout.block_manager import BlockManager
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.rollout.scheduler import Scheduler
from hybridrl.rollout.sequence import Sequence


def group(prompt, n, max_tokens=4):
    seqs = [Sequence(prompt, SamplingParams(n=n, max_tokens=max_tokens), 0, j) for j in range(n)]
    for s in seqs:
        s.group_id = seqs[0].seq_id
    return seqs


def test_fork_shares_blocks_and_copy_on_write_of_partial_block():
    bm = BlockManager(num_blocks=10, block_size=4)
    seqs = group(list(range(6)), 3)  # 6 tokens: one full block + one partial
    bm.allocate(seqs[0])
    for child in seqs[1:]:
        bm.fork(seqs[0], child)
    full, partial = seqs[0].block_table
    assert bm.ref_counts[full] == 3 and bm.ref_counts[partial] == 3 and bm.num_used == 2
    copies = []
    for s in seqs:
        s.append(99, 0.0)
        copies.append(bm.append_slot(s))
    # the first two writers copy the shared partial block, the last one owns it and writes in place
    assert [c is not None for c in copies] == [True, True, False]
    assert all(c[0] == partial for c in copies[:2])
    assert bm.ref_counts[full] == 3 and bm.ref_counts[partial] == 1
    assert {s.block_table[0] for s in seqs} == {full} and len({s.block_table[1] for s in seqs}) == 3
    for s in seqs:
        bm.free(s)
    assert bm.num_free == 10 and all(r == 0 for r in bm.ref_counts)


def test_block_aligned_prompt_needs_new_block_not_copy():
    bm = BlockManager(num_blocks=10, block_size=4)
    a, b = group(list(range(8)), 2)
    bm.allocate(a)
    bm.fork(a, b)
    a.append(1, 0.0)
    assert bm.needs_free_block(a)
    assert bm.append_slot(a) is None and len(a.block_table) == 3 and bm.num_used == 3


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="num_kv_blocks=0"):
        BlockManager(0, 4)


def run_fake(sched, max_steps=500):
    """Drive the scheduler with a fake model that always emits token 7."""
    steps = []
    while not sched.is_finished():
        batch = sched.schedule()
        n = sum(len(g) for g in batch.sample_groups)
        steps.append((batch.is_prefill, len(batch.seqs), n))
        sched.postprocess(batch, [7] * n, [0.0] * n)
        assert len(steps) < max_steps
    return steps


def make_sched(num_blocks, sharing, **kw):
    args = dict(block_size=4, max_num_seqs=64, max_num_batched_tokens=64, max_model_len=64,
                enable_prefix_sharing=sharing, eos_token_ids=())
    args.update(kw)
    return Scheduler(BlockManager(num_blocks, 4), EngineConfig(**args))


def test_sharing_prefills_once_and_uses_fewer_blocks():
    peaks = {}
    for sharing in (True, False):
        sched = make_sched(100, sharing)
        for p in range(2):
            sched.add_group(group(list(range(10 + p)), 4, max_tokens=3))
        steps = run_fake(sched)
        peaks[sharing] = dict(sched.stats)
        assert sched.bm.num_free == 100
        if sharing:
            assert steps[0] == (True, 2, 8)  # 2 prompts computed, 8 samples drawn
    assert peaks[True]["prefill_tokens_computed"] == 21
    assert peaks[False]["prefill_tokens_computed"] == 84
    assert peaks[True]["kv_blocks_peak"] < peaks[False]["kv_blocks_peak"]
    assert peaks[True]["kv_blocks_peak_unshared"] == peaks[False]["kv_blocks_peak"]
    assert peaks[True]["num_cow_copies"] == 2 * 3  # n-1 copies of each prompt's partial block


def test_limits_respected_and_preemption_counted():
    sched = make_sched(9, True, max_num_seqs=6, max_num_batched_tokens=20, max_model_len=20)  # sequences end at 16
    for _p in range(4):
        sched.add_group(group(list(range(6)), 2, max_tokens=10))
    steps = run_fake(sched)
    assert all(rows <= 6 for _, rows, _ in steps)
    assert sched.stats["num_preemptions"] > 0
    assert sched.bm.num_free == 9
    prefill_tokens = [rows for is_prefill, rows, _ in steps if is_prefill]
    assert prefill_tokens and max(prefill_tokens) <= 3  # 20-token budget fits at most three 6-token prompts


def test_cache_too_small_for_one_sequence_raises():
    sched = make_sched(1, True)
    sched.add_group(group(list(range(10)), 1))
    with pytest.raises(ValueError, match="num_kv_blocks=1"):
        sched.schedule()


def test_a_queued_continuation_gives_its_blocks_up_for_the_sequence_ahead_of_it():
    """Nothing runs, the sequence at the head of the queue does not fit, and the blocks are held by a multi-turn
    continuation queued behind it: the continuation's blocks are freed (it is recomputed later) instead of the
    scheduler declaring the cache too small for one sequence."""
    sched = make_sched(4, True)
    cont = Sequence(list(range(10)), SamplingParams(n=1, max_tokens=3), 1, 0)
    sched.bm.allocate(cont)                      # 3 of the 4 blocks
    cont.num_cached_tokens = 9
    fresh = Sequence(list(range(8)), SamplingParams(n=1, max_tokens=3), 0, 0)
    sched.waiting.extend([[fresh], [cont]])
    assert sched.bm.num_free == 1
    batch = sched.schedule()
    assert batch.is_prefill and batch.seqs and sched.stats["num_preemptions"] == 1
    sched.postprocess(batch, [7] * sum(len(g) for g in batch.sample_groups), [0.0] * len(batch.seqs))
    run_fake(sched)
    assert len(fresh.completion_token_ids) == 3 and len(cont.completion_token_ids) == 3
    assert sched.bm.num_free == 4
