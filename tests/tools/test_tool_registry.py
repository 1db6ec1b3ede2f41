"""Tool config loading (verl's YAML shape), Hermes tool-call parsing and verl's tool-answer truncation."""

import pytest
import yaml

from hybridrl.rollout.multi_turn import truncate_tool_response
from hybridrl.rollout.tool_parser import ParsedCall, parse_hermes
from hybridrl.tools.builtin import TOOL_SPECS
from hybridrl.tools.registry import load_tool_config


def write(tmp_path, doc):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def test_parse_hermes_calls_and_malformed_ones():
    text = ('I will compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
            '<tool_call>{"name": calculator}</tool_call><tool_call>[1, 2]</tool_call>'
            '<tool_call>{"name": "x", "arguments": [1]}</tool_call><tool_call>{"name": "y"')
    calls = parse_hermes(text)
    assert calls[:2] == [ParsedCall("calculator", {"expression": "2*3"}), ParsedCall("python", {"code": "print(1)"})]
    assert calls[2].error.startswith("Error: the tool call is not valid JSON")
    assert calls[3].error == 'Error: a tool call must be {"name": <tool name>, "arguments": {...}}'
    assert calls[4] == ParsedCall("x", None, "Error: the tool arguments must be a JSON object")
    assert calls[5].error == "Error: <tool_call> was never closed with </tool_call>"
    assert parse_hermes("no calls here </tool_call>") == []


def test_truncation_follows_verl():
    text = "abcdefghij" * 3
    assert truncate_tool_response(text, 30, "middle") is text
    assert truncate_tool_response(text, 4, "left") == "abcd...(truncated)"
    assert truncate_tool_response(text, 4, "right") == "(truncated)...ghij"
    assert truncate_tool_response(text, 4, "middle") == "ab...(truncated)...ij"


def test_builtins_by_name_and_a_custom_function(tmp_path):
    spec = {"type": "function", "function": {"name": "dedent", "description": "dedent text", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    path = write(tmp_path, {"tools": [
        {"class_name": "hybridrl.tools.builtin.calculator", "config": {"type": "native"}},
        {"class_name": "hybridrl.tools.builtin.python", "config": {"type": "native", "timeout_s": 1}},
        {"class_name": "textwrap.dedent", "config": {"type": "native"}, "tool_schema": spec}]})
    tools = load_tool_config(path)
    assert list(tools) == ["calculator", "python", "dedent"]
    assert tools["calculator"].schema == TOOL_SPECS[0]
    out = tools["calculator"].run({"expression": "123456789 * 987654321"})
    assert (out.text, out.status) == (str(123456789 * 987654321), "ok")
    assert tools["calculator"].run({"expr": "1"}).status == "error"  # unknown / missing argument
    assert tools["calculator"].run({"expression": "1/0"}).status == "error"
    assert tools["python"].run({"code": "print(6 * 7)"}).text.strip() == "42"
    loop = tools["python"].run({"code": "while True:\n    pass"})
    assert loop.status == "timeout" and "timed out after 1s" in loop.text
    assert tools["dedent"].run({"text": "  x"}).text == "x"
    crashed = tools["dedent"].run({"text": 5})
    assert crashed.status == "crash" and crashed.text.startswith("Error: the tool raised")


CALC = {"class_name": "hybridrl.tools.builtin.calculator"}


@pytest.mark.parametrize("doc,message", [
    ("tools: []", "must hold a non-empty 'tools:' list"),
    ("tools: [", "not valid YAML"),
    ({"tools": [{"config": {}}]}, "each entry needs a 'class_name' string"),
    ({"tools": [{**CALC, "config": {"type": "mcp"}}]}, "config.type='mcp': only 'native' tools"),
    ({"tools": [{**CALC, "config": {"timeout_s": 0}}]}, "config.timeout_s=0 must be a number > 0"),
    ({"tools": [{"class_name": "hybridrl.tools.builtin.search"}]}, "no built-in tool 'search'"),
    ({"tools": [{"class_name": "textwrap.dedent"}]}, "is not a built-in, so it needs a tool_schema"),
    ({"tools": [{"class_name": "no_such_module.fn", "tool_schema": TOOL_SPECS[0]}]}, "cannot import module"),
    ({"tools": [{**CALC, "tool_schema": {"type": "function"}}]}, "tool_schema must be {type: function"),
    ({"tools": [CALC, CALC]}, "tool name 'calculator' is used twice"),
    ({"tools": [{**CALC, "extra": 1}]}, "unknown field(s) ['extra']"),
])
def test_bad_tool_configs_are_refused_naming_the_entry(tmp_path, doc, message):
    with pytest.raises(ValueError) as e:
        load_tool_config(write(tmp_path, doc))
    assert message in str(e.value) and "tools.yaml" in str(e.value)
