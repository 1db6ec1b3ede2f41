"""Multi-turn SFT examples: a conversation in verl's multi-turn SFT format (`messages`: system / user / assistant /
tool messages, an assistant's calls in `tool_calls`; optional `tools` schemas for the template's `tools=`) cut into
the token layout a multi-turn rollout produces, with the loss on the assistant's own tokens only.

- Prompt: the chat template's rendering of the messages before the first assistant message, with `tools=` and the
  generation prompt — what the RL dataset feeds the engine.
- Each assistant message: the text the template writes for it from the generation prompt through its end-of-turn
  (eos) token — what the model generates and where it stops. Trained (loss mask 1).
- Between an assistant message's eos and the next generation prompt (the template's glue, the tool or user
  messages, the next `<|im_start|>assistant\n`): not trained (mask 0). With the eos token in front, this is exactly
  what the multi-turn tool agent appends after a turn that ends at `</tool_call>` (rollout/multi_turn.py), so the
  ids equal the rollout's; only that eos is trained here (the model learns to close its turn) and masked there.
- Each piece is tokenized on its own (`add_special_tokens=False`), as the engine's sequence is the prompt's ids,
  then sampled ids, then appended ids.
- The renderings must extend one another (a template that rewrites earlier turns, e.g. drops old reasoning, has
  no such layout) and the template must write the eos token after an assistant message: else ValueError naming
  the row.
"""

from __future__ import annotations

import json

__all__ = ["conversation_segments", "normalize_messages", "tokenize_conversation"]


def normalize_messages(messages, tools) -> tuple[list[dict], list[dict] | None]:
    """Rows as pyarrow reads them -> template inputs: None-valued fields dropped (a struct column fills every field
    of every message), `tools` given as a JSON string parsed."""
    clean = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    if isinstance(tools, str):
        tools = json.loads(tools)
    return clean, (list(tools) if tools else None)


def _render(tokenizer, messages, tools, generation_prompt: bool) -> str:
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False, **extra)


def _after(text: str, prefix: str, where: str) -> str:
    if not text.startswith(prefix):
        raise ValueError(f"{where}: the chat template's rendering of the conversation up to here does not extend "
                         "its rendering of the earlier messages; multi-turn SFT needs a template that appends turns")
    return text[len(prefix):]


def conversation_segments(tokenizer, messages: list[dict], tools=None, where: str = "conversation"
                          ) -> list[tuple[str, bool]]:
    """[(text, trained)]: the prompt (untrained), then alternately an assistant turn through its eos (trained) and
    the text up to the next generation prompt (untrained). Concatenated: the template's rendering of the whole
    conversation without the final newline after the last eos."""
    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        raise ValueError(f"{where}: no assistant message to train on (roles {roles})")
    first = roles.index("assistant")
    if first == 0:
        raise ValueError(f"{where}: the first message is an assistant message; nothing prompts it")
    if roles[-1] != "assistant":
        raise ValueError(f"{where}: the last message is a {roles[-1]!r} message; a conversation must end with the "
                         "assistant's answer")
    eos = tokenizer.eos_token
    text = _render(tokenizer, messages[:first], tools, True)
    segments = [(text, False)]
    for i in (i for i, role in enumerate(roles) if role == "assistant"):
        if i != first:
            following = _render(tokenizer, messages[:i], tools, True)
            segments.append((_after(following, text, f"{where}, message {i}"), False))
            text = following
        turn = _after(_render(tokenizer, messages[:i + 1], tools, False), text, f"{where}, message {i}")
        end = turn.find(eos)
        if end < 0:
            raise ValueError(f"{where}, message {i}: the chat template writes no eos token {eos!r} after an "
                             "assistant message; the model could not learn where its turn ends")
        segments.append((turn[:end + len(eos)], True))
        text += segments[-1][0]
    return segments


def tokenize_conversation(tokenizer, messages: list[dict], tools=None, where: str = "conversation"
                          ) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, response loss mask: 1 on assistant tokens and their eos, 0 elsewhere)."""
    segments = conversation_segments(tokenizer, messages, tools, where)
    prompt = tokenizer.encode(segments[0][0], add_special_tokens=False)
    response, mask = [], []
    for text, trained in segments[1:]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        response += ids
        mask += [int(trained)] * len(ids)
    return prompt, response, mask
