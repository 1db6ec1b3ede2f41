"""Speculative decoding (n-gram drafts, exact verification) against plain decoding and the model (fp32, CPU)."""

import itertools
import math

import pytest
import torch
from rollout_helpers import hf_logprobs, make_engine, tiny_hf_model

import hybridrl.rollout.engine as engine_mod
from hybridrl.rollout.config import EngineConfig, SpeculativeConfig
from hybridrl.rollout.ngram_draft import NgramDrafter
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.rollout.sequence import PLACEHOLDER, Sequence
from hybridrl.rollout.spec_verify import verify_drafts

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8, 5, 6, 7, 8, 5], [10] * 11, [3, 1, 4, 1, 5, 9, 2, 6]]
SPEC = SpeculativeConfig(enable=True, num_draft_tokens=4, max_running_seqs=64)


def _tokens(outs):
    return [c.token_ids for o in outs for c in o.outputs]


def _run(model, params, prompts=PROMPTS, keep_calls=None, **kw):
    engine = make_engine(model, **kw)
    if keep_calls is not None:  # keep each call's scheduler to inspect its block manager afterwards
        start = engine._start
        engine._start = lambda *a: keep_calls.append(start(*a)) or keep_calls[-1]
    return engine.generate(prompts, params), engine.stats


class _Oracle:
    """A drafter that proposes the continuation a reference run produced (`wrong_every`: every such draft position
    of the reference replaced by another token, so that verification rejects it there)."""
    reference: dict = {}
    wrong_every = 0
    vocab = 256

    def __init__(self, groups, config):
        pass

    def propose(self, seq, k):
        ref = self.reference[tuple(seq.token_ids[:seq.num_prompt_tokens])]
        i = seq.num_completion_tokens
        if seq.token_ids[seq.num_prompt_tokens:] != ref[:i]:
            return []
        draft = ref[i:i + k]
        if self.wrong_every:
            draft = [(t + 1) % self.vocab if (i + j) % self.wrong_every == 0 else t for j, t in enumerate(draft)]
        return draft


@pytest.fixture
def oracle(monkeypatch):
    monkeypatch.setattr(engine_mod, "NgramDrafter", _Oracle)
    monkeypatch.setattr(_Oracle, "wrong_every", 0)
    return _Oracle


# ---------------------------------------------------------------------------------------------- the drafter
def _seq(prompt, completion=(), group=None):
    s = Sequence(list(prompt), SamplingParams(), group_id=group)
    s.token_ids += list(completion)
    return s


def test_drafter_prefers_the_longest_then_the_latest_match_and_reads_siblings():
    cfg = SpeculativeConfig(enable=True, min_match=1, max_match=3)
    a = _seq([1, 2, 3, 9, 2, 3, 8, 7, 3, 6], group=0)
    d = NgramDrafter([[a]], cfg)
    a.token_ids += [2, 3]                     # suffix (2, 3): latest occurrence was followed by 8
    assert d.propose(a, 3) == [8, 7, 3]
    a.token_ids += [1, 2, 3]                  # suffix (1, 2, 3) matches the prompt's start (longest match wins)
    assert d.propose(a, 2) == [9, 2]
    a.token_ids += [5]                        # nothing ends with 5 before: no draft (its own suffix never counts)
    assert d.propose(a, 4) == []
    sib_a, sib_b = _seq([4, 4], [1, 2, 3, 4, 5], group=1), _seq([4, 4], [7, 1, 2], group=1)
    d = NgramDrafter([[sib_a, sib_b]], cfg)
    assert d.propose(sib_b, 3) == [3, 4, 5]   # from the sibling's response
    sib_a.token_ids += [6, 1, 2, 0]           # indexed incrementally: the sibling's newer occurrence wins
    assert d.propose(sib_b, 3) == [0]
    sib_a.token_ids.append(PLACEHOLDER)       # a token still in flight is never indexed nor proposed
    sib_b.token_ids += [6, 1, 2]
    assert d.propose(sib_b, 3) == [0]
    assert d.propose(sib_a, 3) == []


def test_drafter_respects_min_match():
    a = _seq([1, 2, 5, 2, 6], group=0)
    d = NgramDrafter([[a]], SpeculativeConfig(enable=True, min_match=2, max_match=4))
    a.token_ids += [7, 2]                     # only a 1-token match (2) exists
    assert d.propose(a, 2) == []
    a.token_ids += [6]                        # (2, 6) occurred, followed by 7, 2, 6 and then by the draft itself
    assert d.propose(a, 4) == [7, 2, 6, 7]


def test_drafter_continues_a_repeating_pattern_past_the_sequence_end():
    d_cfg = SpeculativeConfig(enable=True, min_match=2, max_match=4)
    run = _seq([9, 4, 4, 4], group=0)
    assert NgramDrafter([[run]], d_cfg).propose(run, 5) == [4] * 5
    cycle = _seq([1, 2, 3, 1, 2, 3, 1], group=1)  # period 3: the latest (2, 3, 1) ends one period back
    assert NgramDrafter([[cycle]], d_cfg).propose(cycle, 5) == [2, 3, 1, 2, 3]


# --------------------------------------------------------------------------------- exact acceptance, in isolation
def _target(logits, temperature, top_k, top_p):
    """The sampling distribution, written out independently of the sampler: softmax(logits / T) restricted to the
    top-k tokens and to the smallest prefix (by probability) whose mass reaches top_p."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = p.argsort(descending=True)
    keep = torch.zeros_like(p, dtype=torch.bool)
    mass = 0.0
    for rank, t in enumerate(order.tolist()):
        if (top_k > 0 and rank >= top_k) or (rank > 0 and mass >= top_p):
            break
        keep[t] = True
        mass += float(p[t])
    q = torch.where(keep, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 3, 1.0), (1.3, -1, 0.8), (0.9, 4, 0.9)])
def test_verify_drafts_emits_the_target_distribution(temperature, top_k, top_p):
    """Rows p0, p1, p2 for drafts (d1, d2): the first emitted token must be ~ p0; given it is d1 the second ~ p1;
    given d1 d2 the third ~ p2 — whatever the drafts are. d1 is p0's likeliest token, d2 one that top-k/top-p may
    drop (probability 0 -> always rejected), checked with 5-sigma bounds on 120k draws."""
    V, N = 6, 120_000
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, V, generator=gen) * 1.5
    p = [_target(logits[j], temperature, top_k, top_p) for j in range(3)]
    d1, d2 = int(p[0].argmax()), int(logits[1].argmin())
    reps = torch.full((N,), temperature)
    tokens, logprobs = verify_drafts(logits.repeat(N, 1), [[d1, d2]] * N, reps.repeat_interleave(3),
                                     torch.full((3 * N,), top_k), torch.full((3 * N,), top_p),
                                     torch.Generator().manual_seed(1))
    assert tokens.shape == (N, 3)

    def check(sel, column, probs):
        n = int(sel.sum())
        counts = torch.bincount(tokens[sel, column], minlength=V).double()
        bound = 5 * torch.sqrt(n * probs * (1 - probs)) + 3
        assert ((counts - n * probs).abs() <= bound).all(), (column, counts / n, probs)
        return n

    check(torch.ones(N, dtype=torch.bool), 0, p[0])
    assert check(tokens[:, 0] == d1, 1, p[1]) > 1000
    if float(p[1][d2]) > 0.02:
        check((tokens[:, 0] == d1) & (tokens[:, 1] == d2), 2, p[2])
    else:  # a draft the target never samples is never emitted
        assert not ((tokens[:, 0] == d1) & (tokens[:, 1] == d2)).any()
    emitted = (tokens >= 0).sum(1)
    # a sequence stops at its first rejection: -1 after it, and the first column always holds a token
    assert (tokens[:, 0] >= 0).all() and ((tokens >= 0).long().diff(dim=1) <= 0).all()
    assert emitted.max() <= 3
    logp = torch.log_softmax(logits / temperature, -1)   # over the full vocabulary, as the sampler's
    for j in range(3):
        rows = emitted > j
        torch.testing.assert_close(logprobs[rows, j], logp[j][tokens[rows, j]])


def test_verify_drafts_greedy_is_argmax_token_for_token():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    zeros = torch.zeros(4)
    # sequence 0: drafts (1, 0) both argmax -> bonus argmax of row 2; sequence 1: one draft 2 != argmax 0 -> 0
    tokens, _ = verify_drafts(logits, [[1, 0], []], zeros, zeros.long() - 1, zeros + 1)
    assert tokens.tolist() == [[1, 0, 2], [0, -1, -1]]
    tokens, _ = verify_drafts(logits[[0, 2, 1, 3]], [[2], [1]], zeros, zeros.long() - 1, zeros + 1)
    assert tokens.tolist() == [[1, -1], [0, -1]]


def test_verify_drafts_checks_its_rows():
    with pytest.raises(ValueError, match="one row more than drafts"):
        verify_drafts(torch.zeros(3, 4), [[1, 2, 3]], torch.zeros(3), torch.zeros(3), torch.ones(3))


# ------------------------------------------------------------------------------------- greedy: token-identical
@pytest.mark.parametrize("kw", [{}, {"async_scheduling": True}, {"enable_prefix_sharing": False}],
                         ids=["sync", "async", "unshared"])
def test_greedy_with_ngram_drafts_equals_plain_decoding(kw):
    model = tiny_hf_model("qwen2")
    params = SamplingParams(n=2, temperature=0, max_tokens=20, ignore_eos=True)
    plain, _ = _run(model, params, **kw)
    spec, stats = _run(model, params, speculative=SPEC, **kw)
    assert _tokens(spec) == _tokens(plain)
    for a, b in zip(spec, plain):
        for ca, cb in zip(a.outputs, b.outputs):
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-5, rtol=0)
    assert stats["spec_verify_steps"] > 0 and stats["spec_accepted_tokens"] > 0
    assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]   # rejections too
    assert stats["generated_tokens"] == sum(map(len, _tokens(plain)))


def test_forced_acceptance_emits_k_plus_one_tokens_per_step(oracle):
    model = tiny_hf_model("llama")
    params = SamplingParams(n=2, temperature=0, max_tokens=21, ignore_eos=True)
    plain, plain_stats = _run(model, params)
    oracle.reference = {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, plain)}
    spec, stats = _run(model, params, speculative=SPEC)
    assert _tokens(spec) == _tokens(plain)
    assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"] > 0
    assert stats["spec_mean_acceptance_length"] == 5.0
    assert stats["num_decode_steps"] == 4 < plain_stats["num_decode_steps"] == 20   # 20 tokens after the prefill's


def test_forced_rejections_keep_outputs_and_free_every_block(oracle):
    """Every third draft position is wrong: each verify step rejects at a known place, the blocks of rejected
    positions are given back (all free at the end, also with a cache tight enough to preempt) and later tokens
    read the right K/V (same tokens and log-probs as plain decoding)."""
    model = tiny_hf_model("llama")
    params = SamplingParams(n=4, temperature=0, max_tokens=16, ignore_eos=True)
    plain, _ = _run(model, params)
    oracle.reference = {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, plain)}
    oracle.wrong_every = 3
    for blocks in (256, 30):
        calls = []
        spec, stats = _run(model, params, keep_calls=calls, speculative=SPEC, num_kv_blocks=blocks)
        assert _tokens(spec) == _tokens(plain)
        for a, b in zip(spec, plain):
            for ca, cb in zip(a.outputs, b.outputs):
                torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-5, rtol=0)
        assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
        assert calls[0].sched.bm.num_free == blocks
        assert (stats["num_preemptions"] > 0) == (blocks == 30)


def test_stop_token_and_length_limits_cut_exactly_as_plain_decoding(oracle):
    """The oracle drafts run past an eos token, past max_tokens and past max_model_len: the emitted tokens must stop
    where plain decoding stops, the extra accepted ones dropped and counted."""
    model = tiny_hf_model("qwen2")
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    reference, _ = _run(model, free, max_model_len=64)
    oracle.reference = {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, reference)}
    eos = reference[0].outputs[0].token_ids[6]
    cases = [(SamplingParams(n=2, temperature=0, max_tokens=20), {"eos_token_ids": (eos,), "max_model_len": 64}),
             (SamplingParams(n=2, temperature=0, max_tokens=7, ignore_eos=True), {}),
             (SamplingParams(n=2, temperature=0, max_tokens=20, ignore_eos=True),
              {"max_model_len": 23, "max_num_batched_tokens": 64})]
    for params, kw in cases:
        plain, _ = _run(model, params, **kw)
        spec, stats = _run(model, params, speculative=SPEC, **kw)
        assert _tokens(spec) == _tokens(plain)
        assert [c.finish_reason for o in spec for c in o.outputs] == [c.finish_reason for o in plain for c in o.outputs]
        assert stats["spec_accepted_tokens"] > 0
        if "eos_token_ids" in kw:
            assert "stop" in {c.finish_reason for o in plain for c in o.outputs}
            assert stats["spec_discarded_tokens"] > 0
    assert all(len(p) + len(t) == 23 for p, t in zip(PROMPTS, _tokens(spec)[::2]))


def test_speculation_waits_for_the_tail_and_is_off_for_multi_turn_and_by_default():
    model = tiny_hf_model("qwen2")
    params = SamplingParams(n=3, temperature=0, max_tokens=12, ignore_eos=True)
    _, stats = _run(model, params, speculative=SpeculativeConfig(enable=True, max_running_seqs=4))
    assert stats["spec_verify_steps"] == 0      # 12 sequences run until the end, above the threshold
    _, stats = _run(model, params)
    assert stats["spec_verify_steps"] == 0 and "spec_acceptance_rate" not in stats
    with pytest.raises(ValueError, match=r"speculative.max_match=1 must be >= min_match \(2\)"):
        EngineConfig(speculative=SpeculativeConfig(max_match=1))
    with pytest.raises(ValueError, match="speculative.num_draft_tokens=0 must be >= 1"):
        EngineConfig(speculative=SpeculativeConfig(num_draft_tokens=0))


# ----------------------------------------------------------------------- sampled: distribution and log-probs
def test_sampled_tokens_and_logprobs_are_the_models_after_rejections():
    """With eos, n siblings and repeated-n-gram prompts (drafts accepted and rejected): every emitted token's
    log-prob is the HF model's at the engine's own prefix — a stale K/V slot of a rejected draft would change it."""
    model = tiny_hf_model("qwen2", vocab_size=32)
    params = SamplingParams(n=4, temperature=0.6, top_k=20, max_tokens=24, seed=3)
    outs, stats = _run(model, params, eos_token_ids=(7,), speculative=SPEC)
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    for prompt, out in zip(PROMPTS, outs):
        for c in out.outputs:
            assert (c.finish_reason == "stop" and c.token_ids[-1] == 7 and 7 not in c.token_ids[:-1]) or \
                (c.finish_reason == "length" and len(c.token_ids) == 24 and 7 not in c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), hf_logprobs(model, prompt, c.token_ids, 0.6),
                                       atol=1e-4, rtol=0)


def _exact_prefix_distribution(model, prompt, steps, temperature, top_k):
    """P(first `steps` tokens = t) for every t in V^steps, by enumerating every prefix with HF forwards."""
    V = model.config.vocab_size
    probs = {(): 1.0}
    for _ in range(steps):
        prefixes = list(probs)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(t) for t in prefixes])).logits[:, -1]
        nxt = {}
        for t, row in zip(prefixes, logits):
            p = _target(row, temperature, top_k, 1.0)
            for x in range(V):
                nxt[t + (x,)] = probs[t] * float(p[x])
        probs = nxt
    return probs


@pytest.mark.parametrize("drafter", ["ngram", "greedy_path"])
def test_sampled_distribution_of_the_first_tokens_equals_the_models(drafter, oracle, monkeypatch):
    """A 16-token vocabulary: the empirical distribution of the first three emitted tokens over 2,048 samples
    against the exact one, cell by cell (5 sigma). The first token comes from the prefill; the second and third
    from verify steps whose drafts are accepted and rejected."""
    model = tiny_hf_model("qwen2", vocab_size=16)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    if drafter == "ngram":
        monkeypatch.setattr(engine_mod, "NgramDrafter", NgramDrafter)
    else:
        greedy, _ = _run(model, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), prompts=[prompt])
        oracle.reference = {tuple(prompt): greedy[0].outputs[0].token_ids}
    params = SamplingParams(n=64, temperature=0.8, top_k=8, max_tokens=3, ignore_eos=True, seed=0)
    outs, stats = _run(model, params, prompts=[prompt] * 32, speculative=SPEC)
    assert stats["spec_verify_steps"] > 0 and 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    samples = [tuple(c.token_ids) for o in outs for c in o.outputs]
    N = len(samples)
    exact = _exact_prefix_distribution(model, prompt, 3, 0.8, 8)
    for cut in (1, 2, 3):   # marginal of position cut-1, and of the first two tokens jointly
        for key in (lambda t, c=cut: t[c - 1], *([lambda t: t[:2]] if cut == 2 else [])):
            want: dict = {}
            for t, p in exact.items():
                want[key(t)] = want.get(key(t), 0.0) + p
            got: dict = {}
            for s in samples:
                got[key(s)] = got.get(key(s), 0) + 1
            for cell, p in want.items():
                assert abs(got.get(cell, 0) - N * p) <= 5 * math.sqrt(N * p * (1 - p)) + 3, (cut, cell)
            assert sum(got.values()) == N and set(got) <= {c for c, p in want.items() if p > 0}
    assert len(set(itertools.islice(samples, 256))) > 20   # not a degenerate distribution


# ------------------------------------------------------------------- speculation that finds nothing to draft
class _LateOracle(_Oracle):
    """The oracle's drafts, but only from completion token `start` on (text that starts repeating late)."""
    start = 10**9

    def propose(self, seq, k):
        return super().propose(seq, k) if seq.num_completion_tokens >= self.start else []


def test_draftless_speculation_keeps_the_lookahead_and_probes_until_drafts_come(monkeypatch):
    from hybridrl.rollout.scheduler import DRAFTLESS_STEPS, PROBE_EVERY

    model = tiny_hf_model("qwen2")
    params = SamplingParams(n=2, temperature=0, max_tokens=70, ignore_eos=True)
    plain, plain_stats = _run(model, params, async_scheduling=True)
    monkeypatch.setattr(engine_mod, "NgramDrafter", _LateOracle)
    monkeypatch.setattr(_LateOracle, "reference", {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, plain)})
    silent, stats = _run(model, params, async_scheduling=True, speculative=SPEC)     # never a draft
    assert _tokens(silent) == _tokens(plain)
    assert stats["spec_verify_steps"] == 0
    # all but the first DRAFTLESS_STEPS steps and one probe in PROBE_EVERY overlap as without speculation
    assert stats["spec_probe_steps"] >= (plain_stats["num_lookahead_steps"] - DRAFTLESS_STEPS) // PROBE_EVERY - 1 >= 2
    assert stats["num_lookahead_steps"] >= plain_stats["num_lookahead_steps"] - DRAFTLESS_STEPS \
        - 2 * stats["spec_probe_steps"]
    monkeypatch.setattr(_LateOracle, "start", 40)                                   # drafts appear mid-way
    late, stats = _run(model, params, async_scheduling=True, speculative=SPEC)
    assert _tokens(late) == _tokens(plain)
    assert stats["spec_probe_steps"] >= 1 and stats["spec_verify_steps"] > 0
    assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"]               # the oracle is always right
    assert stats["num_decode_steps"] < plain_stats["num_decode_steps"]
