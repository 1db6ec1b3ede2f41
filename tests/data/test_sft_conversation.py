"""Multi-turn SFT layout (data/sft_conversation.py) with the tiny tokenizer's Qwen2.5-style tool template: the
pieces are the template's rendering cut at the assistant turns, only those trained, and bad conversations or
templates are refused naming the row."""

import pytest
from transformers import AutoTokenizer

from hybridrl.data.sft_conversation import conversation_segments, normalize_messages, tokenize_conversation
from hybridrl.tools.builtin import TOOL_SPECS

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}}
CONVO = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "6*7 and 2+2?"},
         {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
         {"role": "tool", "content": "42"}, {"role": "tool", "content": "42"},
         {"role": "assistant", "content": "#### 42"}, {"role": "user", "content": "and 2+2?"},
         {"role": "assistant", "content": "#### 4"}]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_pieces_are_the_rendering_cut_at_the_assistant_turns(tok):
    segments = conversation_segments(tok, CONVO, TOOL_SPECS[:1])
    full = tok.apply_chat_template(CONVO, tools=TOOL_SPECS[:1], tokenize=False)
    assert "".join(text for text, _ in segments) + "\n" == full
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    assert [(text, trained) for text, trained in segments[1:]] == [
        (f"{call}\n{call}<|im_end|>", True),
        ("\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n42\n</tool_response><|im_end|>\n"
         "<|im_start|>assistant\n", False),
        ("#### 42<|im_end|>", True),
        ("\n<|im_start|>user\nand 2+2?<|im_end|>\n<|im_start|>assistant\n", False),
        ("#### 4<|im_end|>", True)]
    assert segments[0] == (tok.apply_chat_template(CONVO[:2], tools=TOOL_SPECS[:1], tokenize=False,
                                                   add_generation_prompt=True), False)
    prompt, response, mask = tokenize_conversation(tok, CONVO, TOOL_SPECS[:1])
    pieces = [tok.encode(text, add_special_tokens=False) for text, _ in segments]
    assert prompt == pieces[0] and response == sum(pieces[1:], [])
    assert mask == sum(([int(t)] * len(p) for p, (_, t) in zip(pieces[1:], segments[1:])), [])


def test_rows_as_pyarrow_reads_them_are_normalized():
    messages, tools = normalize_messages([{"role": "user", "content": "hi", "tool_calls": None}],
                                         '[{"type": "function", "function": {"name": "f"}}]')
    assert messages == [{"role": "user", "content": "hi"}] and tools == [{"type": "function", "function": {"name": "f"}}]
    assert normalize_messages([], None) == ([], None) and normalize_messages([], [])[1] is None


@pytest.mark.parametrize("messages,error", [
    ([{"role": "user", "content": "hi"}], "no assistant message"),
    ([{"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}], "first message is an assistant"),
    (CONVO[:5], "the last message is a 'tool' message"),
])
def test_conversations_without_an_assistant_answer_to_learn_are_refused(tok, messages, error):
    with pytest.raises(ValueError, match=f"row 7: .*{error}"):
        tokenize_conversation(tok, messages, where="row 7")


def test_templates_without_the_rollout_layout_are_refused(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match=r"row 3, message 2: .*writes no eos token '<\|im_end\|>'"):
        tokenize_conversation(tok, CONVO[:2] + [{"role": "assistant", "content": "x"}], where="row 3")
    # a template that rewrites earlier turns (here: only the last message's content is shown)
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}{{ m['content'] }}<|im_end|>{% endif %}"
                         "{% endfor %}")
    with pytest.raises(ValueError, match="row 3, message 2: .*does not extend"):
        tokenize_conversation(tok, CONVO[:2] + [{"role": "assistant", "content": "x"}], where="row 3")
