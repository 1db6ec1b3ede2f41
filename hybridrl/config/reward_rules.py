"""Rules of the `reward_model` keys when model-based rewards are on (`reward_model.enable=true`), checked at load
time on the resolved config (a plain dict) by `validate.check_semantics`; each message names the key, the value
and the rule. With `enable=false` none of these keys is read, so none is checked.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

from hybridrl.config.limits import same_tokenizer
from hybridrl.dotted import dotted_get

__all__ = ["reward_model_errors"]

RM = "reward_model"


def reward_model_errors(c: dict) -> list[str]:
    g = partial(dotted_get, c)
    if not g(f"{RM}.enable"):
        return []
    if g(f"{RM}.style") == "judge":
        return _judge_errors(g)
    errors = []
    path = g(f"{RM}.model.path")
    if path is None:
        errors.append(f"'{RM}.model.path' is null: with {RM}.enable=true and style=model it must name a reward model "
                      "directory (an AutoModelForSequenceClassification checkpoint with num_labels=1)")
    micro = g(f"{RM}.micro_batch_size_per_gpu")
    if micro != "auto" and not (isinstance(micro, int) and micro > 0):
        errors.append(f"'{RM}.micro_batch_size_per_gpu' = {micro!r} must be 'auto' or a positive integer")
    max_length = g(f"{RM}.max_length")
    if max_length is not None and max_length <= 0:
        errors.append(f"'{RM}.max_length' = {max_length} must be > 0 or null (prompt + response length)")
    fsdp = g(f"{RM}.model.fsdp_config.fsdp_size")
    world = g("trainer.nnodes") * g("trainer.n_gpus_per_node")
    if fsdp != -1 and (fsdp <= 0 or world % fsdp):
        errors.append(f"'{RM}.model.fsdp_config.fsdp_size' = {fsdp} must be -1 (all ranks) or a positive divisor of "
                      f"the world size {world}")
    input_tok = g(f"{RM}.model.input_tokenizer")
    policy_tok = g("data.tokenizer") or g("actor_rollout_ref.model.path")
    if path is not None and not os.path.isdir(os.path.expanduser(path)):
        return errors + [f"'{RM}.model.path' = {path!r} is not a directory (a HF reward model directory: config.json, "
                         "weights, tokenizer)"]
    if input_tok is not None and not g("data.return_raw_chat"):
        errors.append(f"'{RM}.model.input_tokenizer' = {input_tok!r} re-renders each chat with the reward model's "
                      "template, which needs the chat itself: set 'data.return_raw_chat' = true")
    if input_tok is not None and not same_tokenizer(input_tok, policy_tok):
        errors.append(f"'{RM}.model.input_tokenizer' = {input_tok!r} must be the policy's tokenizer {policy_tok!r} "
                      "(data.tokenizer, else actor_rollout_ref.model.path): it decodes the policy's responses")
    if input_tok is None and path is not None:
        differs = ("tokenizer" if not same_tokenizer(path, policy_tok) else
                   "chat template" if chat_template(path) != chat_template(policy_tok) else None)
        if differs:
            errors.append(f"'{RM}.model.input_tokenizer' is null, so the reward model at {path!r} would read the "
                          f"policy's token ids, but its {differs} differs from the policy's ({policy_tok!r}): set "
                          f"{RM}.model.input_tokenizer to the policy's tokenizer path (and data.return_raw_chat=true) "
                          "to re-render each chat with the reward model's own tokenizer and template")
    return errors


def chat_template(path: str) -> str | None:
    """The chat template a HF tokenizer directory holds (chat_template.jinja, else tokenizer_config.json's)."""
    where = Path(os.path.expanduser(path))
    if (where / "chat_template.jinja").is_file():
        return (where / "chat_template.jinja").read_text()
    config = where / "tokenizer_config.json"
    return json.loads(config.read_text()).get("chat_template") if config.is_file() else None


def _judge_errors(g) -> list[str]:
    from hybridrl.rewards.judge import judge_template_errors, score_pattern_errors, template_fields

    template = g(f"{RM}.judge.prompt_template")
    errors = judge_template_errors(template) + score_pattern_errors(g(f"{RM}.judge.score_pattern"))
    if not errors and "prompt" in template_fields(template) and not g("data.return_raw_chat"):
        errors.append(f"'{RM}.judge.prompt_template' uses {{prompt}} (the sample's last user message), which needs "
                      "the chat itself: set 'data.return_raw_chat' = true")
    max_tokens, response = g(f"{RM}.judge.max_tokens"), g("data.max_response_length")
    if not 0 < max_tokens <= response:
        errors.append(f"'{RM}.judge.max_tokens' = {max_tokens} must be in [1, data.max_response_length = {response}] "
                      "(the engine's responses are at most that long)")
    return errors
