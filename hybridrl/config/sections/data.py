"""The `data` section: the prompt files, lengths and batch sizes."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.values import Truncation


@dataclass(frozen=True)
class DataConfig(Section):
    """`data`."""

    tokenizer: str | None
    """path of a tokenizer; null = actor_rollout_ref.model.path"""
    train_files: str | list[str]
    """parquet file(s) in verl's schema: one path or a list (docs/your-own-run.md); the default is the demo's, which `hybridrl train` with no arguments writes"""
    val_files: str | list[str] | None
    """validation parquet file(s); null = no validation; the default is the demo's"""
    prompt_key: str
    """column holding the chat messages of the prompt"""
    reward_fn_key: str
    """column that selects the reward function per row"""
    max_prompt_length: int
    """prompt tokens (left-padded to this length)"""
    max_response_length: int
    """generated tokens per sample at most"""
    train_batch_size: int
    """prompts per step (before rollout.n); at most the training set's rows (the demo's 600 give 2 steps an epoch)"""
    gen_batch_size: int | None
    """prompts per generation batch; null = train_batch_size. Another value only with algorithm.filter_groups.enable, which generates batches until train_batch_size prompts with signal are collected"""
    val_batch_size: int | None
    """null = the whole validation set in one batch"""
    return_raw_chat: bool
    """also return the untokenized chat (non_tensor `raw_prompt`)"""
    shuffle: bool
    """shuffle the training set every epoch"""
    seed: int
    """seed of the dataloader shuffle"""
    filter_overlong_prompts: bool
    """drop (and count) prompts longer than max_prompt_length"""
    truncation: Truncation
    """error | left | right, when filter_overlong_prompts is false"""
    dataloader_num_workers: int
    """must be 0: prompts are tokenized once at load, batches are collated in the driver (verl's 8 worker processes would have nothing to do)"""
