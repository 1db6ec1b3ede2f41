"""Tool-call parsing of an assistant turn, by format (`multi_turn.format`).

Formats:
- `hermes` (Qwen2.5 / Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, whitespace around the
  JSON allowed; `arguments` may also be a JSON string holding the object (as OpenAI's API writes it).
- `qwen3_coder` (Qwen3-Coder's XML-style tags): `<tool_call><function=NAME><parameter=P>VALUE</parameter>...
  </function></tool_call>`. A value is read as JSON where it parses as a JSON number, boolean, null, array or
  object and the tool's schema does not declare the parameter a string; else it is the text itself (one leading and
  one trailing newline dropped, as the template writes them).
- `llama3_json` (Llama 3.1/3.2's JSON tool calling): the turn's content, after an optional `<|python_tag|>`, is
  one JSON object `{"name": ..., "parameters": {...}}` (`arguments` accepted too) or several separated by `;`. A
  turn whose content does not start with `{` holds no call. Calls end with the turn (eos / `<|eom_id|>`), so
  there is no closing tag to stop at.

Choices:
- Every call opened in the turn yields one `ParsedCall`: a name and an arguments dict, or `error` saying why it
  cannot run (not JSON, no name, arguments not an object, never closed) — the error becomes the tool message, so
  the model sees what was wrong, and is counted.
- Calls written inside a reasoning block (`<think>…</think>`; an unclosed `<think>` reasons to the turn's end) are
  not calls: they are removed before parsing and counted (`ParsedTurn.in_reasoning`), so a model thinking about a
  call does not run it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["FORMATS", "ParsedCall", "ParsedTurn", "ToolFormat", "get_format", "parse_hermes", "strip_reasoning"]

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class ParsedCall:
    name: str | None
    arguments: dict | None
    error: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    calls: list[ParsedCall]
    in_reasoning: int = 0        # calls found inside <think> blocks, not run


def strip_reasoning(text: str) -> tuple[str, str]:
    """(the text outside <think> blocks, the text inside them)."""
    outside, inside, pos = [], [], 0
    while (start := text.find(THINK_START, pos)) >= 0:
        outside.append(text[pos:start])
        end = text.find(THINK_END, start)
        if end < 0:
            inside.append(text[start:])
            return "".join(outside), "".join(inside)
        inside.append(text[start:end])
        pos = end + len(THINK_END)
    outside.append(text[pos:])
    return "".join(outside), "".join(inside)


def _arguments(name, args) -> ParsedCall:
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ParsedCall(name, None, f"Error: the tool arguments are not valid JSON ({e.msg})")
    if not isinstance(args, dict):
        return ParsedCall(name, None, "Error: the tool arguments must be a JSON object")
    return ParsedCall(name, args)


def _json_call(body: str, args_keys: tuple[str, ...], shape: str) -> ParsedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ParsedCall(None, None, f"Error: the tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall(None, None, f"Error: a tool call must be {shape}")
    key = next((k for k in args_keys if k in obj), None)
    return _arguments(obj["name"], obj[key] if key else {})


def _tagged(text: str, start_tag: str, end_tag: str, parse_body) -> list[ParsedCall]:
    calls, pos = [], 0
    while (start := text.find(start_tag, pos)) >= 0:
        body_start = start + len(start_tag)
        end = text.find(end_tag, body_start)
        if end < 0:
            calls.append(ParsedCall(None, None, f"Error: {start_tag} was never closed with {end_tag}"))
            break
        calls.append(parse_body(text[body_start:end].strip()))
        pos = end + len(end_tag)
    return calls


def parse_hermes(text: str, schemas=None) -> list[ParsedCall]:
    """The Hermes tool calls of a turn's text, in order."""
    return _tagged(text, "<tool_call>", "</tool_call>",
                   lambda body: _json_call(body, ("arguments",), '{"name": <tool name>, "arguments": {...}}'))


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _param_types(schemas) -> dict[str, dict[str, str]]:
    out = {}
    for s in schemas or ():
        fn = s.get("function", s)
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name")] = {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
    return out


def parse_qwen3_coder(text: str, schemas=None) -> list[ParsedCall]:
    """The Qwen3-Coder tool calls of a turn's text, in order; `schemas` (OpenAI-style tool schemas) say which
    parameters are strings."""
    types = _param_types(schemas)

    def body(inner: str) -> ParsedCall:
        m = _FUNCTION.search(inner)
        if m is None:
            return ParsedCall(None, None, "Error: a tool call must be <function=NAME><parameter=P>VALUE</parameter>"
                                          "...</function>")
        name, args = m.group(1).strip(), {}
        for p, raw in _PARAMETER.findall(m.group(2)):
            value = raw.removeprefix("\n").removesuffix("\n")
            if types.get(name, {}).get(p.strip()) != "string":
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            args[p.strip()] = value
        return ParsedCall(name, args)

    return _tagged(text, "<tool_call>", "</tool_call>", body)


def parse_llama3_json(text: str, schemas=None) -> list[ParsedCall]:
    """The Llama 3 JSON tool calls of a turn's content (eos text and whitespace around it ignored)."""
    for end in ("<|eot_id|>", "<|eom_id|>"):
        text = text.replace(end, "")
    content = text.strip().removeprefix("<|python_tag|>").strip()
    if not content.startswith("{"):
        return []
    return [_json_call(part.strip(), ("parameters", "arguments"), '{"name": <tool name>, "parameters": {...}}')
            for part in _split_objects(content)]


def _split_objects(content: str) -> list[str]:
    """JSON objects separated by ';' (the separator may also occur inside strings, so split by bracket depth)."""
    parts, depth, start, in_str, esc = [], 0, 0, False, False
    for i, ch in enumerate(content):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ";" and depth == 0:
            parts.append(content[start:i])
            start = i + 1
    parts.append(content[start:])
    return [p for p in parts if p.strip()]


@dataclass(frozen=True)
class ToolFormat:
    name: str
    call_end: str | None      # text that closes a call (a turn may end right after it), None: calls end with the turn
    parse_text: object        # (text, schemas) -> list[ParsedCall]

    def parse(self, text: str, schemas=None) -> ParsedTurn:
        outside, inside = strip_reasoning(text)
        return ParsedTurn(self.parse_text(outside, schemas), in_reasoning=len(self.parse_text(inside, schemas)))


_FORMATS = {f.name: f for f in (ToolFormat("hermes", "</tool_call>", parse_hermes),
                                ToolFormat("qwen3_coder", "</tool_call>", parse_qwen3_coder),
                                ToolFormat("llama3_json", None, parse_llama3_json))}
FORMATS = tuple(_FORMATS)


def get_format(name: str) -> ToolFormat:
    if name not in _FORMATS:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={name!r}: supported formats are {FORMATS}")
    return _FORMATS[name]
