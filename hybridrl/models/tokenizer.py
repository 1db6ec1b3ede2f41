"""The policy's tokenizer, loaded the same way by every part of a run that reads or writes its tokens (the driver's
prompt tokenization, the multi-turn tool agent's chat-template deltas): `data.tokenizer`, else
`actor_rollout_ref.model.path`; `actor_rollout_ref.model.custom_chat_template` (verl's key) replaces its chat
template — for a model whose own template cannot render tool calls or tool messages, for example;
`data.apply_chat_template_kwargs` (verl's key) are bound to its apply_chat_template, so every render passes them;
pad = eos when the tokenizer has no pad token."""

from __future__ import annotations

import functools
import os
from pathlib import Path

KEY = "actor_rollout_ref.model.custom_chat_template"


def resolve_chat_template(value: str | None, key: str = KEY) -> str | None:
    """The template text of `custom_chat_template`: a Jinja string, or the path of a file holding one. Raises
    ValueError naming the config key `key` when the file is missing or the template does not compile."""
    if value is None:
        return None
    text = str(value)
    path = Path(os.path.expanduser(text))
    if "{" not in text:  # no Jinja tag or expression: a file name
        if not path.is_file():
            raise ValueError(f"'{key}' = {text!r}: not a Jinja template (no '{{') and no such file")
        text = path.read_text()
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:  # the environment transformers renders chat templates in
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    except TemplateError as e:
        raise ValueError(f"'{key}': the template does not compile: {e}") from e
    return text


def policy_tokenizer(config):
    from transformers import AutoTokenizer

    path = config.data.tokenizer or config.actor_rollout_ref.model.path
    tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(path),
                                              trust_remote_code=config.actor_rollout_ref.model.trust_remote_code)
    template = resolve_chat_template(config.actor_rollout_ref.model.custom_chat_template)
    if template is not None:
        tokenizer.chat_template = template
    template_kwargs = dict(config.data.apply_chat_template_kwargs or {})
    if template_kwargs:   # every render of this tokenizer passes them (a call's own arguments win)
        tokenizer.apply_chat_template = functools.partial(tokenizer.apply_chat_template, **template_kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
