"""The engine's side of partial rollouts: a per-call token budget and continuations (fp32 tiny models, CPU)."""

import pytest
import torch
from rollout_helpers import make_engine, tiny_hf_model

from hybridrl.rollout.sampling_params import BUDGET, Continuation, SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 11]


def continue_all(engine, outs, params):
    """One more call going on from every BUDGET-stopped sample of `outs` (a list of CompletionOutput lists)."""
    conts = [Continuation(list(p), c.token_ids, c.logprobs) for p, cs in zip(PROMPTS, outs) for c in cs]
    got = engine.generate([], params, continuations=conts)
    return [[o.outputs[0]] for o in got]


def test_budget_stops_exactly_and_reports_unfinished_samples():
    engine = make_engine(tiny_hf_model("qwen2"))
    params = SamplingParams(n=3, temperature=0.8, max_tokens=20, ignore_eos=True, seed=3, token_budget=5)
    outs = engine.generate(PROMPTS, params)
    for out in outs:
        for c in out.outputs:
            assert len(c.token_ids) == len(c.logprobs) == 5
            assert c.finish_reason == BUDGET
    assert engine.stats["generated_tokens"] == 5 * 3 * len(PROMPTS)
    # a continuation with 17 of max_tokens=20: the length limit comes first and the sample is complete
    cont = Continuation(PROMPTS[0], outs[0].outputs[0].token_ids * 3 + [1, 2], [-1.0] * 17)
    done = engine.generate([], params, continuations=[cont])[0].outputs[0]
    assert len(done.token_ids) == 20 and done.finish_reason == "length"
    assert done.token_ids[:17] == cont.token_ids and done.logprobs[:17] == cont.logprobs  # the earlier part as given
    assert engine.stats["generated_tokens"] == 3  # only this call's tokens


def test_eos_before_the_budget_finishes_with_stop():
    model = tiny_hf_model("qwen2")
    free = make_engine(model).generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    tokens = free[0].outputs[0].token_ids
    stop = tokens[2]
    engine = make_engine(model, eos_token_ids=(stop,))
    out = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=10, token_budget=6))[0].outputs[0]
    assert out.token_ids == tokens[:tokens.index(stop) + 1] and out.finish_reason == "stop"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_continuing_with_unchanged_weights_is_lossless_under_greedy(async_scheduling):
    """Interrupted every 4 tokens and continued (re-prefilled) three times = one uninterrupted greedy call."""
    model = tiny_hf_model("llama")
    engine = make_engine(model, async_scheduling=async_scheduling)
    whole = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True))
    first = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True,
                                                    token_budget=4))
    parts = [o.outputs for o in first]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, token_budget=4)
    # continuations are one sample each: regroup them per prompt (2 samples a prompt) after each call
    for reason in (BUDGET, "length"):
        flat = continue_all(engine, parts, params)
        parts = [[c[0] for c in flat[2 * i:2 * i + 2]] for i in range(len(PROMPTS))]
        assert {c.finish_reason for cs in parts for c in cs} == {reason}
    for out, cs in zip(whole, parts):
        for ref, got in zip(out.outputs, cs):
            assert got.token_ids == ref.token_ids
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-4, rtol=0)


def test_prompts_and_continuations_in_one_call_come_back_in_order():
    engine = make_engine(tiny_hf_model("qwen2"))
    params = SamplingParams(n=2, temperature=0, max_tokens=8, ignore_eos=True, token_budget=3)
    conts = [Continuation([4, 5, 6], [9, 9], [-0.5, -0.25])]
    outs = engine.generate(PROMPTS[:2], params, continuations=conts)
    assert [len(o.outputs) for o in outs] == [2, 2, 1]
    assert outs[2].prompt_token_ids == [4, 5, 6] and outs[2].outputs[0].token_ids[:2] == [9, 9]
    assert len(outs[2].outputs[0].token_ids) == 5


@pytest.mark.parametrize("cont,match", [
    (Continuation([1, 2], [3], []), "1 tokens but 0 log-probs"),
    (Continuation([1, 2], [3] * 8, [0.0] * 8), "room for one more"),
    (Continuation([1, 2], [999], [0.0]), "outside"),
])
def test_bad_continuations_are_refused(cont, match):
    engine = make_engine(tiny_hf_model("qwen2"))
    with pytest.raises(ValueError, match=match):
        engine.generate([], SamplingParams(max_tokens=8), continuations=[cont])


def test_token_budget_must_be_positive():
    with pytest.raises(ValueError, match="token_budget"):
        SamplingParams(token_budget=0)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_on_group_done_reports_each_group_once_as_it_finishes(async_scheduling):
    """Many eos tokens: samples stop after varied lengths. Each group is reported once, between steps, as soon as its
    longest sample ends (so in the order of its longest sample), with the outputs generate returns."""
    engine = make_engine(tiny_hf_model("qwen2"), eos_token_ids=tuple(range(3, 120)), async_scheduling=async_scheduling)
    prompts = [[i + 1, i + 2, i + 3] for i in range(8)]
    reported, unfinished = [], []

    def on_group_done(output):   # the samples not finished yet, as other threads read them meanwhile
        reported.append(output)
        unfinished.append((engine.unfinished_seqs, engine.call_seqs))
    outs = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_tokens=30, seed=1),
                           on_group_done=on_group_done)
    assert all(total == 24 for _, total in unfinished) and unfinished[-1][0] == 0
    assert [u for u, _ in unfinished] == sorted((u for u, _ in unfinished), reverse=True)
    assert all(u <= 24 - 3 * (i + 1) for i, (u, _) in enumerate(unfinished))   # at least the reported groups' samples
    assert (engine.unfinished_seqs, engine.call_seqs) == (0, 0)    # between calls
    assert sorted(o.request_id for o in reported) == list(range(len(prompts)))
    for o in reported:
        final = outs[o.request_id]
        assert o.prompt_token_ids == final.prompt_token_ids
        assert [(c.token_ids, c.logprobs, c.finish_reason) for c in o.outputs] == \
               [(c.token_ids, c.logprobs, c.finish_reason) for c in final.outputs]
    longest = [max(len(c.token_ids) for c in o.outputs) for o in reported]
    assert longest == sorted(longest) and longest[0] < longest[-1]


def test_on_group_done_is_refused_with_an_agent():
    engine = make_engine(tiny_hf_model("qwen2"))
    with pytest.raises(ValueError, match="on_group_done"):
        engine.generate([[1, 2]], SamplingParams(max_tokens=2), agent=object(), on_group_done=print)
