"""What a sequence-classification reward model reads for each sample, as token ids in its own vocabulary.

Two ways, after verl's RewardModelWorker (`reward_model.model.input_tokenizer`):
- null: the reward model shares the policy's tokenizer and chat template, so it reads the policy's own ids
  (prompt + response, the valid tokens of `input_ids`), with no decoding on the way;
- set (the policy's tokenizer): the response is decoded with it (special tokens skipped, so the policy's end-of-
  turn marker does not leak into the text), appended to the sample's chat (`raw_prompt`, data.return_raw_chat) as
  the assistant turn, and the chat is rendered and encoded by the reward model's tokenizer and chat template.
An input longer than `reward_model.max_length` is cut by `reward_model.truncation` (left keeps the end, where the
score is read) and counted, or refused with `error`.
"""

from __future__ import annotations

from hybridrl.protocol import DataProto

__all__ = ["rm_token_lists", "truncate_ids"]

TRUNCATIONS = ("left", "right", "error")


def truncate_ids(ids: list[int], max_length: int, truncation: str, row: int) -> tuple[list[int], bool]:
    """(ids cut to max_length, whether they were cut); truncation='error' raises instead of cutting."""
    if len(ids) <= max_length:
        return ids, False
    if truncation == "error":
        raise ValueError(f"reward-model input of sample {row} has {len(ids)} tokens > reward_model.max_length="
                         f"{max_length} (reward_model.truncation=error); raise max_length or set truncation to "
                         "left or right")
    if truncation not in TRUNCATIONS:
        raise ValueError(f"reward_model.truncation={truncation!r}: must be one of {TRUNCATIONS}")
    return (ids[-max_length:] if truncation == "left" else ids[:max_length]), True


def _rerendered(data: DataProto, rm_tokenizer, input_tokenizer) -> list[list[int]]:
    if "raw_prompt" not in data.non_tensor_batch:
        raise ValueError("reward_model.model.input_tokenizer is set (the chat is re-rendered with the reward model's "
                         "template) but the batch has no raw_prompt: set data.return_raw_chat=true")
    responses, mask = data.batch["responses"], data.batch["response_mask"].bool()
    out = []
    for i, chat in enumerate(data.non_tensor_batch["raw_prompt"]):
        messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else \
            [{"role": m["role"], "content": m["content"]} for m in chat]
        response = input_tokenizer.decode(responses[i][mask[i]].tolist(), skip_special_tokens=True)
        text = rm_tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": response}],
                                                add_generation_prompt=False, tokenize=False)
        out.append(list(rm_tokenizer.encode(text, add_special_tokens=False)))
    return out


def rm_token_lists(data: DataProto, rm_tokenizer, input_tokenizer, max_length: int,
                   truncation: str) -> tuple[list[list[int]], int]:
    """(per-sample reward-model input ids, how many were truncated). `input_tokenizer` None: the policy's ids."""
    if input_tokenizer is None:
        ids, attn = data.batch["input_ids"], data.batch["attention_mask"].bool()
        lists = [row[m].tolist() for row, m in zip(ids, attn)]
    else:
        lists = _rerendered(data, rm_tokenizer, input_tokenizer)
    cut = [truncate_ids(ids, max_length, truncation, i) for i, ids in enumerate(lists)]
    return [ids for ids, _ in cut], sum(was for _, was in cut)
