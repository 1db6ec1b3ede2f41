"""Tool-call parsing of an assistant turn, Hermes/Qwen format (`multi_turn.format: hermes`).

A call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (whitespace around the JSON allowed). Every
`<tool_call>` opened in the turn yields one `ParsedCall`: either a name and an arguments dict, or `error` saying
why it cannot run (not JSON, no name, arguments not an object, never closed) — the error becomes the tool
message, so the model sees what was wrong, and is counted. `arguments` may also be a JSON string holding the
object (some models emit it that way, as OpenAI's API does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["CALL_END", "CALL_START", "ParsedCall", "parse_hermes"]

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
FORMATS = ("hermes",)


@dataclass(frozen=True)
class ParsedCall:
    name: str | None
    arguments: dict | None
    error: str | None = None


def _parse_one(body: str) -> ParsedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ParsedCall(None, None, f"Error: the tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall(None, None, 'Error: a tool call must be {"name": <tool name>, "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ParsedCall(obj["name"], None, f"Error: the tool arguments are not valid JSON ({e.msg})")
    if not isinstance(args, dict):
        return ParsedCall(obj["name"], None, "Error: the tool arguments must be a JSON object")
    return ParsedCall(obj["name"], args)


def parse_hermes(text: str) -> list[ParsedCall]:
    """The tool calls of one assistant turn's text, in order."""
    calls, pos = [], 0
    while (start := text.find(CALL_START, pos)) >= 0:
        body_start = start + len(CALL_START)
        end = text.find(CALL_END, body_start)
        if end < 0:
            calls.append(ParsedCall(None, None, f"Error: {CALL_START} was never closed with {CALL_END}"))
            break
        calls.append(_parse_one(text[body_start:end].strip()))
        pos = end + len(CALL_END)
    return calls
