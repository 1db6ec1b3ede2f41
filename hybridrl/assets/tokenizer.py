"""A small byte-level BPE tokenizer trained on the built-in tasks' text, saved in HF format.

Choices:
- Byte-level BPE with exactly Qwen2's normaliser (NFC), split regex and byte-level pre-tokenizer: transformers 5
  rebuilds a qwen2-typed tokenizer as `Qwen2Tokenizer` from tokenizer.json's vocab and merges whatever
  pre-tokenizer the file holds (DESIGN.md §5), so training with the same pipeline makes AutoTokenizer, the raw
  `tokenizers` file and our own training agree id for id. `tokenizer_class` is Qwen2Tokenizer for every
  architecture, so a llama-typed tiny model loads the same tokenizer.
- Special tokens first (ids 0..3): <|endoftext|>, <|im_start|>, <|im_end|>, <|pad|>. eos = <|im_end|> (a chat
  model stops there), pad = <|pad|> (distinct from eos, so a padded position is never mistaken for a stop).
- ChatML chat template (Qwen style, no default system prompt), with Qwen2.5's tool rendering (`tools=`, tool calls,
  `tool` messages) so multi-turn tool rollouts run on the tiny model.
- Trained on a fixed-seed sample of every built-in task (prompts and solutions), so the tokenizer does not
  depend on the model seed and encodes the tasks compactly. Every byte is in the alphabet: any text encodes.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "train_tokenizer", "save_tokenizer"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|pad|>"
# Qwen2's pre-tokenize regex (transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX).
QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# ChatML as Qwen2.5 writes it, tools included: with `tools=` a system block lists them (Hermes format) and asks for
# <tool_call>{"name": ..., "arguments": ...}</tool_call>; an assistant message's tool_calls are written that way;
# `tool` messages become one user turn of <tool_response> blocks. Without tools nothing differs from plain ChatML.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{{- tool_call['arguments'] | tojson }}{{- '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
# the tasks whose text trains the tokenizer: fixed, so a task added later does not change every tiny model
CORPUS_TASKS = ("arith", "countdown", "gsm8k-synthetic")
CORPUS_ROWS_PER_TASK = 300


def task_corpus(rows_per_task: int = CORPUS_ROWS_PER_TASK) -> list[str]:
    from hybridrl.data.tasks import TASKS

    texts = ["system\nYou are a helpful assistant.", "user\n", "assistant\n"]
    for task in (TASKS[name] for name in CORPUS_TASKS):
        for row in task.generate(rows_per_task, 0, seed=0)["train"]:
            texts.append(row["prompt"][0]["content"])
            texts.append(row["answer"])
    return texts


def train_tokenizer(vocab_size: int = 512, texts: list[str] | None = None) -> Tokenizer:
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"tokenizer vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(texts if texts is not None else task_corpus(), trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str | Path, model_max_length: int = 32768):
    """Save as an HF tokenizer (tokenizer.json, tokenizer_config.json, chat template); returns the HF object."""
    import json

    from transformers import Qwen2Tokenizer

    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    hf_tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, unk_token=None, bos_token=None,
                            eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, model_max_length=model_max_length,
                            additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)])
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(out_dir))
    return hf_tok
