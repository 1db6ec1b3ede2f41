"""The `data` section: the prompt files, lengths and batch sizes."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.rules import Findings
from hybridrl.config.sections.values import Truncation


@dataclass(frozen=True)
class DataConfig(Section):
    """`data`."""

    tokenizer: str | None
    """path of a tokenizer; null = actor_rollout_ref.model.path"""
    train_files: str | list[str]
    """parquet file(s) in verl's schema: one path or a list (docs/your-own-run.md); the default is the demo's, which
    `hybridrl train` with no arguments writes"""
    val_files: str | list[str] | None
    """validation parquet file(s); null = no validation; the default is the demo's"""
    prompt_key: str
    """column holding the chat messages of the prompt"""
    image_key: str
    """column of a row's images (verl's multimodal key): a file whose rows hold values there is refused, naming the
    column (prompts are text only here)"""
    video_key: str
    """column of a row's videos: refused like image_key's"""
    reward_fn_key: str
    """column that selects the reward function per row"""
    max_prompt_length: int
    """prompt tokens (left-padded to this length)"""
    max_response_length: int
    """generated tokens per sample at most"""
    train_batch_size: int
    """prompts per step (before rollout.n); at most the training set's rows (the demo's 600 give 2 steps an epoch;
    verl's default: 1024)"""
    gen_batch_size: int | None
    """prompts per generation batch; null = train_batch_size. Another value only with algorithm.filter_groups.enable,
    which generates batches until train_batch_size prompts with signal are collected"""
    val_batch_size: int | None
    """null = the whole validation set in one batch"""
    train_max_samples: int
    """use at most this many rows of the training files (before overlong prompts are filtered): a random subset
    seeded by data.seed with data.shuffle, else the first rows, as verl selects them; -1 = all"""
    val_max_samples: int
    """the same for the validation files; -1 = all"""
    return_raw_chat: bool
    """also return the untokenized chat (non_tensor `raw_prompt`; verl's default: true, which its agent loops
    need; here multi-turn rollouts work from the token ids)"""
    apply_chat_template_kwargs: dict
    """extra variables for the policy's chat template wherever it renders (prompts, tool and user turns, the judge),
    e.g. +data.apply_chat_template_kwargs.enable_thinking=false for Qwen3; {} = none"""
    shuffle: bool
    """shuffle the training set every epoch"""
    seed: int | None
    """seed of the dataloader shuffle (and of data.train_max_samples' subset); null = verl's unseeded order: a seed
    drawn when the run starts, printed, and saved with each checkpoint's dataloader state, which a resume reads
    back"""
    filter_overlong_prompts: bool
    """drop (and count) prompts longer than max_prompt_length (verl's default: false, with truncation=error)"""
    truncation: Truncation
    """error | left | right | middle (both ends kept), when filter_overlong_prompts is false"""
    dataloader_num_workers: int
    """0: prompts are tokenized once at load and batches are collated in the driver, so no loader process runs; a
    positive value (verl's default is 8) is accepted with a warning saying so"""

    def check_sizes(self, found: Findings) -> None:
        found.positive(self, "data", ("train_batch_size", "max_prompt_length", "max_response_length"))
        found.positive_or_unset(self, "data", ("val_batch_size",))
        for key in ("train_max_samples", "val_max_samples"):
            value = getattr(self, key)
            if value != -1 and value <= 0:
                found.errors.append(f"'data.{key}' = {value} must be -1 (all rows) or a positive number of rows")

    def check(self, cfg, found: Findings) -> None:
        """Rules of the data keys (`cfg`: the whole PPOConfig)."""
        if self.dataloader_num_workers < 0:
            found.errors.append(f"'data.dataloader_num_workers' = {self.dataloader_num_workers} must be >= 0")
        elif self.dataloader_num_workers:
            found.warnings.append(f"'data.dataloader_num_workers' = {self.dataloader_num_workers}: no loader process "
                                  "runs (prompts are tokenized once when the dataset loads and batches are collated "
                                  "in the driver)")
        gen, tbs, fg = self.gen_batch_size, self.train_batch_size, "algorithm.filter_groups"
        rollout_dp = cfg.trainer.world_size // cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
        if gen is None or not rollout_dp:  # a TP degree above the world size is the rollout's error
            return
        if gen <= 0 or gen % rollout_dp:
            found.errors.append(f"'data.gen_batch_size' = {gen} must be a positive multiple of the rollout dp size "
                                f"{rollout_dp}")
        elif gen != tbs and not cfg.algorithm.filter_groups.enable:
            found.errors.append(f"'data.gen_batch_size' = {gen} differs from data.train_batch_size = {tbs} but "
                                f"'{fg}.enable' is false: each step trains on one generation batch, so they must be "
                                "equal")
