"""Admission policy on the real Scheduler/BlockManager without a model (benchmarks/kv_admission_sim.py's helper):
`all` (every sequence admitted, preempt by recompute) vs `cap` (only the sequences whose worst-case KV fits)."""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kv_admission_sim import cap_seqs, simulate  # noqa: E402

PROMPTS, N, PROMPT_LEN, LIMIT, BS = 4, 4, 8, 32, 4   # worst case per sequence: (8 + 32) / 4 = 10 blocks
BLOCKS = 80                                            # half of the 16 sequences' worst case
CAP = cap_seqs(BLOCKS, PROMPT_LEN, LIMIT, BS)


def run(lengths, max_num_seqs, ignore_eos=False):
    return simulate(lengths, prompt_len=PROMPT_LEN, response_limit=LIMIT, num_blocks=BLOCKS,
                    max_num_seqs=max_num_seqs, block_size=BS, ignore_eos=ignore_eos)


def test_all_without_pressure_never_preempts_and_is_not_slower():
    rng = random.Random(0)
    lengths = [[rng.randint(1, 12) for _ in range(N)] for _ in range(PROMPTS)]  # 16 x <= 5 blocks fit 80
    cap, every = run(lengths, CAP), run(lengths, PROMPTS * N)
    assert CAP == 8
    assert every["preemptions"] == 0 and cap["preemptions"] == 0
    assert every["decode_steps"] <= cap["decode_steps"]
    flat = [x for row in lengths for x in row]
    assert every["completion_lengths"] == flat and cap["completion_lengths"] == flat


def test_all_at_limit_preempts_but_loses_nothing():
    lengths = [[LIMIT] * N for _ in range(PROMPTS)]
    cap, every = run(lengths, CAP, ignore_eos=True), run(lengths, PROMPTS * N, ignore_eos=True)
    assert every["preemptions"] > 0 and every["prefill_tokens_recompute"] > 0
    assert cap["preemptions"] == 0
    for r in (cap, every):
        assert r["completion_lengths"] == [LIMIT] * (PROMPTS * N)
        assert set(r["finish_reasons"]) == {"length"}
        assert r["peak_blocks_used"] <= BLOCKS
