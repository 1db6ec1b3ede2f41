"""Multi-turn in the native engine with a scripted agent (no tokenizer, no tools): a turn ends after a fixed number
of sampled tokens, fixed tokens are appended, and generation continues on the cached KV. The reference is a
re-prefill of the whole history: HF's teacher-forced forward over prompt + completion must give the engine's
greedy token (argmax) and its log-prob at every model-sampled position."""

import threading
import time
from concurrent.futures import Future

import pytest
import torch
from rollout_helpers import make_engine, tiny_hf_model

from hybridrl.rollout.multi_turn import TurnOutcome
from hybridrl.rollout.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 11, [20, 21, 22, 23, 24, 25, 26, 27]]  # 5, 3, 11, 8 tokens
INJECT = [30, 31, 32, 33, 34]


class ScriptedAgent:
    """Ends a turn after `turn_len` sampled tokens; appends INJECT `turns - 1` times, then finishes the trajectory.
    With `delay_s` the outcome comes from a thread after delay_s x the prompt's index (prompt 0 at once): the other
    prompts' sequences are still "in their tools" while prompt 0's decode."""

    def __init__(self, turn_len=3, turns=3, delay_s=0.0, inject=INJECT):
        self.turn_len, self.turns, self.delay_s, self.inject = turn_len, turns, delay_s, inject
        self.budgets = []
        self.in_tools = 0  # outcomes not delivered yet
        self.lock = threading.Lock()
        self.sampled_during_tools = 0  # tokens sampled (by any sequence) while some outcome was pending

    def ends_turn(self, seq):
        self.sampled_during_tools += self.in_tools > 0
        return len(seq) - seq.turn_start >= self.turn_len

    def on_turn_end(self, seq, budget):
        self.budgets.append((seq.num_completion_tokens, budget))
        seq.agent_state = (seq.agent_state or 0) + 1
        future = Future()
        outcome = TurnOutcome(list(self.inject)) if seq.agent_state < self.turns else TurnOutcome(None, "stop")
        if len(self.inject) > budget and outcome.token_ids is not None:
            outcome = TurnOutcome(None, "length")
        if self.delay_s and seq.request_id:
            with self.lock:
                self.in_tools += 1

            def deliver():
                time.sleep(self.delay_s * seq.request_id)
                with self.lock:
                    self.in_tools -= 1
                future.set_result(outcome)
            threading.Thread(target=deliver).start()
        else:
            future.set_result(outcome)
        return future

    def trajectory_stats(self, seq):
        return {"turns": seq.agent_state}


def teacher_forced(model, prompt, completion):
    ids = torch.tensor([prompt + completion], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).cpu()


def check_against_reprefill(model, outputs, mask_expected, atol=1e-4):
    for prompt_out in outputs:
        for c in prompt_out.outputs:
            logp = teacher_forced(model, prompt_out.prompt_token_ids, c.token_ids)
            assert c.response_mask == mask_expected
            model_pos = [i for i, m in enumerate(c.response_mask) if m]
            tokens = torch.tensor(c.token_ids)
            assert logp[model_pos].argmax(-1).tolist() == tokens[model_pos].tolist()
            got = torch.tensor(c.logprobs)
            torch.testing.assert_close(got[model_pos], logp[model_pos].gather(1, tokens[model_pos, None])[:, 0],
                                       atol=atol, rtol=0)
            assert all(got[i] == 0.0 for i, m in enumerate(c.response_mask) if not m)


def expected_mask(turn_len, turns):
    return ([1] * turn_len + [0] * len(INJECT)) * (turns - 1) + [1] * turn_len


@pytest.mark.parametrize("engine_kw", [{}, {"async_scheduling": True}, {"enable_prefix_sharing": False}],
                         ids=["sync", "async", "unshared"])
def test_continuation_on_cached_kv_equals_reprefill(engine_kw):
    model = tiny_hf_model("qwen2")
    engine = make_engine(model, **engine_kw)
    params = SamplingParams(n=2, temperature=0, max_tokens=40, ignore_eos=True)
    agent = ScriptedAgent(turn_len=3, turns=3, delay_s=0.1)
    outs = engine.generate(PROMPTS, params, agent=agent)
    check_against_reprefill(model, outs, expected_mask(3, 3))
    assert all(c.finish_reason == "stop" and c.turn_stats == {"turns": 3} for o in outs for c in o.outputs)
    assert agent.sampled_during_tools > 0  # the engine decoded other sequences while tools were running
    # the continuations prefilled only the last sampled token + the appended ones, never the history again
    prompt_tokens = sum(len(p) for p in PROMPTS) * (1 if engine_kw.get("enable_prefix_sharing", True) else 2)
    assert engine.stats["prefill_tokens_computed"] == prompt_tokens + 2 * len(PROMPTS) * 2 * (1 + len(INJECT))


def test_turn_ending_on_first_token_copies_the_shared_prompt_block():
    """turn_len=1: the sample pauses before it ever decoded, so its partial prompt block is still shared with its
    siblings; the continuation must copy it (else it would overwrite their KV)."""
    model = tiny_hf_model("llama")
    engine = make_engine(model)
    outs = engine.generate(PROMPTS, SamplingParams(n=3, temperature=0, max_tokens=40, ignore_eos=True),
                           agent=ScriptedAgent(turn_len=1, turns=4))
    assert engine.stats["num_cow_copies"] > 0
    check_against_reprefill(model, outs, expected_mask(1, 4))


def test_preemption_with_paused_sequences_holding_blocks():
    model = tiny_hf_model("qwen2")
    ref = make_engine(model).generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=40, ignore_eos=True),
                                      agent=ScriptedAgent(turns=3))
    tight = make_engine(model, num_kv_blocks=14)
    got = tight.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=40, ignore_eos=True),
                         agent=ScriptedAgent(turns=3, delay_s=0.02))
    assert tight.stats["num_preemptions"] > 0
    assert [c.token_ids for o in got for c in o.outputs] == [c.token_ids for o in ref for c in o.outputs]
    check_against_reprefill(model, got, expected_mask(3, 3))


def test_budget_counts_model_and_appended_tokens_and_a_cut_ends_with_length():
    model = tiny_hf_model("qwen2")
    engine = make_engine(model)
    agent = ScriptedAgent(turn_len=3, turns=10)
    outs = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), agent=agent)
    c = outs[0].outputs[0]
    # turns of 3 + 5 appended: after 3 -> budget 20-3-1=16; after 11 -> 8; after 19 -> 0 (cut)
    assert agent.budgets == [(3, 16), (11, 8), (19, 0)]
    assert c.finish_reason == "length" and len(c.token_ids) == 19
    assert c.response_mask == [1, 1, 1] + [0] * 5 + [1, 1, 1] + [0] * 5 + [1, 1, 1]
