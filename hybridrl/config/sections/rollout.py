"""`actor_rollout_ref.rollout`: the generation engine and its sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.base import Section
from hybridrl.config.sections.multi_turn import MultiTurnConfig
from hybridrl.config.sections.values import Auto, Dtype


@dataclass(frozen=True)
class RolloutConfig(Section):
    """`actor_rollout_ref.rollout`."""

    name: Literal["native", "hf"]
    """native (our paged-KV engine) | hf (transformers generate, any causal LM); vllm and sglang run on the native engine, with a warning"""
    mode: Literal["sync"]
    """sync = the driver waits for the whole batch"""
    temperature: float
    """sampling temperature (0 = greedy)"""
    top_k: int
    """-1 = off"""
    top_p: float
    """nucleus sampling mass"""
    do_sample: bool
    """false = greedy"""
    n: int
    """samples per prompt (GRPO group size: grpo and rloo compare a prompt's samples, so they need n > 1; PPO with gae may use 1)"""
    prompt_length: int
    """prompt tokens the engine accepts"""
    response_length: int
    """max generated tokens"""
    dtype: Dtype
    """engine weight and KV dtype"""
    gpu_memory_utilization: float
    """ceiling (vLLM's per-instance meaning): the engine's weights + KV + activations stay within this fraction of the GPU; the KV is sized by the run plan to this step's batch"""
    ignore_eos: bool
    """keep generating after eos (benchmarks)"""
    enforce_eager: bool
    """true = no CUDA graphs"""
    free_cache_engine: bool
    """sleep the engine after each rollout (hybrid engine)"""
    tensor_model_parallel_size: int
    """TP size of a generation engine; rollout dp = world / this"""
    max_num_batched_tokens: int
    """token budget of one prefill step"""
    max_num_seqs: int
    """sequences decoded together at most (the run plan lowers it when their KV would not fit next to the training state; the rest wait their turn)"""
    block_size: int
    """tokens per KV-cache block"""
    enable_prefix_sharing: bool
    """the n samples of a prompt share its KV blocks"""
    async_scheduling: Auto | bool
    """native engine: launch decode step t+1 before reading step t (hides the host's per-step work behind the GPU); auto = on on GPUs, off on CPU (where the synchronous loop is the reference)"""
    speculative: SpeculativeDecodingConfig
    log_prob_micro_batch_size: int | None
    """deprecated global form; use the _per_gpu key"""
    log_prob_micro_batch_size_per_gpu: Auto | int | None
    """samples per old-log-prob forward per GPU (results go to CPU at once); auto = the run plan's choice"""
    log_prob_use_dynamic_bsz: Auto | bool
    """micro-batches by token count instead of rows; auto as actor.use_dynamic_bsz, for log_prob_micro_batch_size_per_gpu"""
    log_prob_max_token_len_per_gpu: Auto | int
    """token budget with log_prob_use_dynamic_bsz; auto = the run plan's choice"""
    log_prob_unshard_once: Auto | bool
    """all-gather FSDP shards once per pass, not per micro-batch (true|false|auto: if the bf16 model <= 25% of GPU memory)"""
    seed: int
    """sampling seed, mixed with trainer.seed and the step, offset by the rollout dp rank (TP ranks of a group share it)"""
    partial_rollout: PartialRolloutConfig
    multi_turn: MultiTurnConfig
    val_kwargs: ValKwargsConfig


@dataclass(frozen=True)
class ValKwargsConfig(Section):
    """`actor_rollout_ref.rollout.val_kwargs`."""

    top_k: int
    """validation sampling: -1 = off"""
    top_p: float
    """validation nucleus mass"""
    temperature: float
    """validation temperature (0 = greedy)"""
    n: int
    """validation samples per prompt"""
    do_sample: bool
    """validation: false = greedy"""


@dataclass(frozen=True)
class PartialRolloutConfig(Section):
    """`actor_rollout_ref.rollout.partial_rollout`."""

    enable: bool
    """opt-in, off-policy partial rollouts (Kimi k1.5, APRIL, AReaL): a step samples at most max_new_tokens_per_step new tokens per sample, carries unfinished samples into the next step (continued with the new weights), and trains a prompt group once all its n samples are done, with their rollout log-probs as the behaviour policy and truncated IS (algorithm.rollout_correction.rollout_is: token unless set); see docs/architecture.md"""
    max_new_tokens_per_step: int | None
    """the per-step token budget of one sample (required with enable; at >= response_length nothing is ever carried)"""
    max_staleness: int
    """steps a carried group may wait: a group first sampled more than this many steps before the step that would train it is dropped (counted: partial/dropped_stale); >= 1"""


@dataclass(frozen=True)
class SpeculativeDecodingConfig(Section):
    """`actor_rollout_ref.rollout.speculative`."""

    enable: bool
    """native engine: lossless speculative decoding in the rollout's tail — each decode step also checks draft tokens looked up in the sequence's prompt, its own and its siblings' responses (n-gram match), accepted so that the sampled distribution is unchanged; not for multi-turn rollouts"""
    num_draft_tokens: int
    """draft tokens per sequence and step at most"""
    min_match: int
    """shortest suffix of a sequence's tokens looked up for a draft"""
    max_match: int
    """longest suffix looked up (the longest match wins)"""
    max_running_seqs: Auto | int
    """speculate only while at most this many sequences run; auto = the verify step's rows (sequences x (num_draft_tokens + 1)) within half the GPU's ridge point (FLOP/s over bytes/s), where a step is memory-bound"""
