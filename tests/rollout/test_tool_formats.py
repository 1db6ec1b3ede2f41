"""Tool-call formats (hermes, qwen3_coder, llama3_json) as models write them, calls inside reasoning blocks, the
per-turn token limit and concurrent calls: the parser alone, then the agent's turn decisions on a real tokenizer."""

import pytest
import yaml
from multi_turn_tools import active
from transformers import AutoTokenizer

from hybridrl.rollout.multi_turn import MultiTurnSettings, ToolAgent
from hybridrl.rollout.tool_parser import ParsedCall, get_format, strip_reasoning
from hybridrl.tools.builtin import TOOL_SPECS
from hybridrl.tools.registry import load_tool_config

SCHEMAS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}, "filters": {"type": "object"}}}}}]


def test_qwen3_coder_calls_typed_by_the_schema():
    text = ("I will search.\n<tool_call>\n<function=search>\n<parameter=query>\n42\n</parameter>\n"
            "<parameter=limit>\n5\n</parameter>\n<parameter=filters>\n{\"lang\": \"en\"}\n</parameter>\n</function>\n"
            "</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nline one\nline two\n</parameter>\n"
            "</function>\n</tool_call>")
    turn = get_format("qwen3_coder").parse(text, SCHEMAS)
    assert turn.calls == [ParsedCall("search", {"query": "42", "limit": 5, "filters": {"lang": "en"}}),
                          ParsedCall("search", {"query": "line one\nline two"})]
    # without a schema a value that parses as JSON is read as JSON
    assert get_format("qwen3_coder").parse(text).calls[0].arguments["query"] == 42
    bad = get_format("qwen3_coder").parse("<tool_call>\nsearch(query=1)\n</tool_call><tool_call><function=x>")
    assert [c.name for c in bad.calls] == [None, None]
    assert "<function=NAME>" in bad.calls[0].error and "never closed" in bad.calls[1].error


def test_llama3_json_calls_with_and_without_python_tag():
    fmt = get_format("llama3_json")
    one = fmt.parse('<|python_tag|>{"name": "search", "parameters": {"query": "a; b"}}<|eom_id|>')
    assert one.calls == [ParsedCall("search", {"query": "a; b"})]   # the ';' inside the string does not split
    two = fmt.parse('{"name": "search", "arguments": "{\\"limit\\": 2}"}; {"name": "calc", "parameters": {}}')
    assert two.calls == [ParsedCall("search", {"limit": 2}), ParsedCall("calc", {})]
    assert fmt.parse("The answer is 42.<|eot_id|>").calls == []    # plain content holds no call
    assert fmt.parse('{"query": "no name"}').calls[0].error.startswith("Error: a tool call must be")
    assert fmt.call_end is None                                   # calls end with the turn


def test_calls_inside_reasoning_are_counted_not_parsed():
    text = ('<think>maybe <tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
            '</think>So: <tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>')
    turn = get_format("hermes").parse(text)
    assert turn.calls == [ParsedCall("calculator", {"expression": "6*7"})] and turn.in_reasoning == 1
    unclosed = get_format("hermes").parse('<think>still thinking <tool_call>{"name": "c"}</tool_call>')
    assert unclosed.calls == [] and unclosed.in_reasoning == 1
    assert strip_reasoning("a<think>b</think>c<think>d") == ("ac", "<think>b<think>d")


class _Seq:
    """The fields of an engine Sequence the agent reads: its tokens, where the current turn starts, its state, its
    prompt's index in the generate call."""

    def __init__(self, prompt_ids, turn_ids):
        self.token_ids, self.turn_start, self.agent_state = prompt_ids + turn_ids, len(prompt_ids), None
        self.request_id = 0


def _agent(tokenizer_dir, tmp_path, entries, **settings):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": entries}))
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tok, ToolAgent(tok, load_tool_config(path), MultiTurnSettings(**settings), eos_token_ids=[tok.eos_token_id])


CALC = {"class_name": "hybridrl.tools.builtin.calculator", "config": {"type": "native"}}


def _turn(tok, text):
    prompt = tok.encode("<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return _Seq(prompt, tok.encode(text, add_special_tokens=False))


def test_agent_runs_qwen3_coder_calls_and_skips_calls_in_reasoning(tool_model_dir, tmp_path):
    tok, agent = _agent(tool_model_dir, tmp_path, [CALC], format="qwen3_coder")
    try:
        seq = _turn(tok, "<tool_call>\n<function=calculator>\n<parameter=expression>\n6*7\n</parameter>\n"
                         "</function>\n</tool_call>")
        assert agent.ends_turn(seq)
        outcome = agent.on_turn_end(seq, budget=200).result(timeout=10)
        assert "42" in tok.decode(outcome.token_ids) and seq.agent_state.tool_calls == 1
        thinking = _turn(tok, '<think><tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n'
                              '</parameter>\n</function>\n</tool_call>')
        assert not agent.ends_turn(thinking)   # the call closed inside the reasoning block: the turn goes on
        thinking.token_ids += tok.encode("</think>The answer is 2.<|im_end|>", add_special_tokens=False)
        assert agent.ends_turn(thinking)
        done = agent.on_turn_end(thinking, budget=200).result(timeout=10)
        assert done.token_ids is None and done.finish_reason == "stop"
        assert thinking.agent_state.calls_in_reasoning == 1 and thinking.agent_state.tool_calls == 0
    finally:
        agent.close()


def test_per_turn_token_limit_ends_the_trajectory_and_is_counted(tool_model_dir, tmp_path):
    tok, agent = _agent(tool_model_dir, tmp_path, [CALC], max_tokens_per_turn=8)
    try:
        seq = _turn(tok, "one two three four five six seven eight nine ten")
        seq.token_ids = seq.token_ids[:seq.turn_start + 7]
        assert not agent.ends_turn(seq)
        seq.token_ids.append(tok.encode(" x", add_special_tokens=False)[0])
        assert agent.ends_turn(seq)
        outcome = agent.on_turn_end(seq, budget=200).result(timeout=10)
        assert (outcome.token_ids, outcome.finish_reason, seq.agent_state.cut) == (None, "length", "turn_length")
    finally:
        agent.close()
    with pytest.raises(ValueError, match="max_tokens_per_turn=0"):
        MultiTurnSettings(max_tokens_per_turn=0)


def test_a_turns_calls_run_concurrently(tool_model_dir, tmp_path):
    slow = {"class_name": "multi_turn_tools.slow_square", "config": {"type": "native", "timeout_s": 5},
            "tool_schema": TOOL_SPECS[0]}
    tok, agent = _agent(tool_model_dir, tmp_path, [slow], max_parallel_calls=3)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    active["max"] = 0
    try:
        seq = _turn(tok, call * 3 + "<|im_end|>")
        outcome = agent.on_turn_end(seq, budget=500).result(timeout=20)
        assert tok.decode(outcome.token_ids).count("42") == 3 and seq.agent_state.tool_calls == 3
        assert active["max"] == 3   # all three were running at once
    finally:
        agent.close()
