"""Async scheduling (decode step t+1 launched before step t is read) against the synchronous loop (fp32, CPU)."""

import torch
from rollout_helpers import hf_logprobs, make_engine, tiny_hf_model

from hybridrl.rollout.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 11, [3, 1, 4, 1, 5, 9, 2, 6]]


def _tokens(outs):
    return [c.token_ids for o in outs for c in o.outputs]


def _run(model, params, **kw):
    engine = make_engine(model, **kw)
    outs = engine.generate(PROMPTS, params)
    return outs, engine.stats


def test_greedy_with_eos_equals_sync_and_drops_the_samples_of_ended_sequences():
    model = tiny_hf_model("qwen2")
    free = _tokens(make_engine(model).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=14,
                                                                       ignore_eos=True)))
    eos = free[0][4]  # ends prompt 0 early; other prompts may run to max_tokens
    params = SamplingParams(n=2, temperature=0, max_tokens=14)
    sync, s_stats = _run(model, params, eos_token_ids=(eos,))
    lookahead, a_stats = _run(model, params, eos_token_ids=(eos,), async_scheduling=True)
    assert _tokens(lookahead) == _tokens(sync)
    assert [c.finish_reason for o in lookahead for c in o.outputs] == [c.finish_reason for o in sync for c in o.outputs]
    assert {"stop", "length"} <= {c.finish_reason for o in sync for c in o.outputs}
    for a, b in zip(lookahead, sync):
        for ca, cb in zip(a.outputs, b.outputs):
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-5, rtol=0)
    assert s_stats["num_lookahead_steps"] == 0
    assert a_stats["num_lookahead_steps"] > 0 and a_stats["num_lookahead_discarded"] > 0
    assert a_stats["generated_tokens"] == s_stats["generated_tokens"] == sum(map(len, _tokens(sync)))


def test_seeded_sampling_without_eos_equals_sync_token_for_token():
    model = tiny_hf_model("llama")
    params = SamplingParams(n=3, temperature=0.8, top_k=50, max_tokens=13, ignore_eos=True, seed=11)
    sync, _ = _run(model, params)
    lookahead, stats = _run(model, params, async_scheduling=True)
    assert _tokens(lookahead) == _tokens(sync)
    assert stats["num_lookahead_steps"] >= 10 and stats["num_lookahead_discarded"] == 0
    assert stats["kv_blocks_peak"] < stats["kv_blocks_peak_unshared"]  # prompt sharing still on


def test_sampled_with_eos_outputs_are_consistent_with_the_model():
    """With ended sequences the random stream shifts, so compare with the model instead: every reported
    log-prob is the HF log-prob of the token the engine says it sampled after the tokens before it (a wrong
    device-side token feed would break this), and every output ends on eos or at max_tokens."""
    model = tiny_hf_model("qwen2")
    eos = 7
    params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=3)
    outs, stats = _run(model, params, eos_token_ids=(eos,), async_scheduling=True)
    assert stats["num_lookahead_steps"] > 0
    for prompt, out in zip(PROMPTS, outs):
        for c in out.outputs:
            assert (c.finish_reason == "stop" and c.token_ids[-1] == eos and eos not in c.token_ids[:-1]) or \
                (c.finish_reason == "length" and len(c.token_ids) == 12 and eos not in c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), hf_logprobs(model, prompt, c.token_ids),
                                       atol=1e-4, rtol=0)


def test_tight_kv_cache_falls_back_to_reading_first_and_keeps_greedy_outputs():
    model = tiny_hf_model("llama")
    params = SamplingParams(n=4, temperature=0, max_tokens=12, ignore_eos=True)
    ref, _ = _run(model, params)
    tight, stats = _run(model, params, num_kv_blocks=14, async_scheduling=True)
    assert stats["num_preemptions"] > 0 and stats["num_lookahead_steps"] > 0
    assert _tokens(tight) == _tokens(ref)


def test_max_model_len_ends_sequences_without_lookahead_past_it():
    model = tiny_hf_model("qwen2")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    sync, _ = _run(model, params, max_model_len=20, max_num_batched_tokens=64)
    lookahead, _ = _run(model, params, max_model_len=20, max_num_batched_tokens=64, async_scheduling=True)
    assert _tokens(lookahead) == _tokens(sync)
    assert all(len(p) + len(t) == 20 for p, t in zip(PROMPTS, _tokens(sync)))
