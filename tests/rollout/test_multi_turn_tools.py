"""Multi-turn tool rollouts in the native engine with the tiny tool model (tests/conftest.py `tool_model_dir`: it
calls the calculator for 6*7 on bignum prompts, then answers '#### 42'): the trajectory's tokens, masks and log-probs, the limits,
and tools that time out, crash or do not exist — each contained and counted."""

import pytest
import torch
import yaml
from tool_model_data import TOOL_MODEL_PROMPTS, bignum_prompts, tool_conversation
from transformers import AutoModelForCausalLM, AutoTokenizer
from typed_sections import actor_section

from hybridrl.protocol import DataProto
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.engine import LLMEngine
from hybridrl.rollout.multi_turn import MultiTurnSettings, ToolAgent
from hybridrl.rollout.sampling_params import SamplingParams
from hybridrl.rollout.to_dataproto import outputs_to_dataproto
from hybridrl.tools.builtin import TOOL_SPECS
from hybridrl.tools.registry import load_tool_config

QUESTIONS = bignum_prompts(*TOOL_MODEL_PROMPTS)[:2]
CALCULATOR = {"class_name": "hybridrl.tools.builtin.calculator", "config": {"type": "native"}}
GREEDY = SamplingParams(n=2, temperature=0, max_tokens=160)


@pytest.fixture(scope="module")
def setup(tool_model_dir):
    tok = AutoTokenizer.from_pretrained(tool_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32).eval()
    return tok, model, make_engine(model, max_num_seqs=16)


def make_engine(model, max_num_seqs):
    config = EngineConfig(dtype=torch.float32, block_size=16, num_kv_blocks=32 * max_num_seqs,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=2048, max_model_len=1024,
                          enforce_eager=True)
    engine = LLMEngine(model.config, config, device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    engine.wake_up(("kv_cache",))
    return engine


def make_agent(tok, tmp_path, entries, **settings):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": entries}))
    return ToolAgent(tok, load_tool_config(path), MultiTurnSettings(**settings), eos_token_ids=[tok.eos_token_id])


def custom(name, timeout_s=0.5):
    """A test tool from multi_turn_tools.py under the calculator's schema (the model calls it by that name)."""
    return {"class_name": f"multi_turn_tools.{name}", "config": {"type": "native", "timeout_s": timeout_s},
            "tool_schema": TOOL_SPECS[0]}


def run(setup, agent, params=GREEDY, questions=QUESTIONS):
    tok, _, engine = setup
    prompts = [tool_conversation(tok, q, TOOL_SPECS[:1])[0] for q in questions]
    try:
        return prompts, engine.generate(prompts, params, agent=agent)
    finally:
        agent.close()


def test_tool_call_runs_and_the_trajectory_is_the_whole_conversation_tokenized(setup, tmp_path):
    tok, model, _ = setup
    prompts, outs = run(setup, make_agent(tok, tmp_path, [CALCULATOR]))
    for q, out in zip(QUESTIONS, outs):
        _, turn1, appended, turn2 = tool_conversation(tok, q, TOOL_SPECS[:1])
        for c in out.outputs:
            # exactly the template's conversation: call, tool message with the calculator's 42, answer, eos;
                # verl counts turns as assistant (2) + tool (1) + the prompt (1)
            assert c.token_ids == turn1 + appended + turn2
            assert c.response_mask == [1] * len(turn1) + [0] * len(appended) + [1] * len(turn2)
            assert c.finish_reason == "stop"
            assert c.turn_stats["num_turns"] == 4 and c.turn_stats["tool_calls"] == 1
            assert c.turn_stats["tool_errors"] == 0 and c.turn_stats["cut"] == ""

    # the training batch: tool tokens attended but masked, their rollout log-probs 0; the actor's forward over it
    # (teacher-forced, padded batch) reproduces the engine's log-probs on the model's tokens
    from hybridrl.training.actor import DataParallelPPOActor

    P, R = max(map(len, prompts)), 160
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    data = outputs_to_dataproto(batch, outs, response_length=R, pad_token_id=pad)
    resp_attn = data.batch["attention_mask"][:, P:]
    assert (resp_attn.sum(1) == len(turn1 + appended + turn2)).all()
    assert int((resp_attn.bool() & ~data.batch["response_mask"].bool()).sum()) == 4 * len(appended)
    assert (data.batch["rollout_log_probs"][data.batch["response_mask"] == 0] == 0).all()
    assert data.non_tensor_batch["__num_turns__"].tolist() == [4] * 4
    assert data.non_tensor_batch["tool_call_counts"].tolist() == [1] * 4
    actor = DataParallelPPOActor(actor_section(), model, use_remove_padding=False)
    data.meta_info.update(temperature=1.0, micro_batch_size=2)
    actor_lp, _ = actor.compute_log_prob(data)
    m = data.batch["response_mask"].bool()
    torch.testing.assert_close(actor_lp[m], data.batch["rollout_log_probs"][m], atol=1e-4, rtol=0)


def test_assistant_turn_limit_ends_the_trajectory_and_counts_the_cut(setup, tmp_path):
    tok = setup[0]
    _, outs = run(setup, make_agent(tok, tmp_path, [CALCULATOR], max_assistant_turns=1))
    for out in outs:
        for c in out.outputs:
            assert set(c.response_mask) == {1}  # nothing appended: the call was not run
            assert c.turn_stats["cut"] == "turns" and c.turn_stats["tool_calls"] == 0
            assert c.turn_stats["num_turns"] == 2


@pytest.mark.parametrize("tool,status,message", [
    ("sandbox_loop", "tool_timeouts", "Error: timed out after 1s"),
    ("hang", "tool_timeouts", "Error: the tool did not answer within 0.5s"),
    ("crash", "tool_crashes", "Error: the tool raised RuntimeError: cannot evaluate 6*7"),
])
def test_timeouts_and_crashes_are_answered_with_an_error_and_counted(setup, tmp_path, tool, status, message):
    tok = setup[0]
    entry = custom(tool, timeout_s=5 if tool == "sandbox_loop" else 0.5)  # the sandbox's own 1 s limit acts first
    _, outs = run(setup, make_agent(tok, tmp_path, [entry], max_assistant_turns=2), questions=QUESTIONS[:1])
    for c in outs[0].outputs:
        s = c.turn_stats
        assert (s["tool_calls"], s["tool_errors"], s[status], s["user_turns"]) == (1, 1, 1, 1)
        appended = [t for t, m in zip(c.token_ids, c.response_mask) if not m]
        assert message in tok.decode(appended)


def test_unknown_tool_and_truncated_answers_are_counted(setup, tmp_path):
    tok = setup[0]
    other = {**custom("long_answer"), "tool_schema": {**TOOL_SPECS[0], "function": {
        **TOOL_SPECS[0]["function"], "name": "other"}}}
    _, outs = run(setup, make_agent(tok, tmp_path, [other], max_assistant_turns=2), questions=QUESTIONS[:1])
    s = outs[0].outputs[0].turn_stats
    assert (s["malformed_calls"], s["tool_errors"]) == (1, 1)
    _, outs = run(setup, make_agent(tok, tmp_path, [custom("long_answer")], max_assistant_turns=2,
                                    max_tool_response_length=20, tool_response_truncate_side="middle"),
                  questions=QUESTIONS[:1])
    c = outs[0].outputs[0]
    assert c.turn_stats["truncated_responses"] == 1 and c.turn_stats["tool_errors"] == 0
    appended = tok.decode([t for t, m in zip(c.token_ids, c.response_mask) if not m])
    assert "0123456789...(truncated)...0123456789\n</tool_response>" in appended


def test_tools_of_different_trajectories_run_concurrently(setup, tmp_path):
    import multi_turn_tools

    tok = setup[0]
    multi_turn_tools.active.update(now=0, max=0)
    entry = custom("slow_square", timeout_s=5)
    _, outs = run(setup, make_agent(tok, tmp_path, [entry], max_assistant_turns=2))
    assert all(c.turn_stats["tool_calls"] == 1 and c.turn_stats["tool_errors"] == 0 for o in outs for c in o.outputs)
    assert multi_turn_tools.active["max"] > 1


def test_every_running_trajectory_can_wait_on_its_tool_at_once(setup, tmp_path):
    """The agent's thread pools are sized by the sequences the engine runs at once: 32 trajectories reaching their
    tool call on the same step all wait together (a fixed pool of 16 made half of them queue for a thread)."""
    import multi_turn_tools

    tok, model, _ = setup
    engine = make_engine(model, max_num_seqs=32)
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [custom("slow_square", timeout_s=5)]}))
    agent = ToolAgent(tok, load_tool_config(path), MultiTurnSettings(max_assistant_turns=2),
                      eos_token_ids=[tok.eos_token_id], max_running_seqs=32)
    multi_turn_tools.active.update(now=0, max=0)
    _, outs = run((tok, model, engine), agent, params=SamplingParams(n=16, temperature=0, max_tokens=160))
    assert sum(c.turn_stats["tool_calls"] for o in outs for c in o.outputs) == 32
    assert multi_turn_tools.active["max"] > 16


def test_length_budget_cuts_before_the_tool_message(setup, tmp_path):
    """max_tokens leaves room for the call but not for the tool message: the trajectory ends there (length)."""
    tok = setup[0]
    _, turn1, appended, _ = tool_conversation(tok, QUESTIONS[0], TOOL_SPECS[:1])
    params = SamplingParams(temperature=0, max_tokens=len(turn1) + len(appended))  # no room for a sampled token
    _, outs = run(setup, make_agent(tok, tmp_path, [CALCULATOR]), params=params, questions=QUESTIONS[:1])
    c = outs[0].outputs[0]
    assert c.token_ids == turn1 and c.finish_reason == "length"
    assert c.turn_stats["cut"] == "length" and c.turn_stats["user_turns"] == 0
