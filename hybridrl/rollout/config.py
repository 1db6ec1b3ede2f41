"""EngineConfig: every size and switch of the rollout engine in one validated, frozen value.

Choices:
- One config handed whole to the engine, its model runner and each call's scheduler, so a size is read where it
  is used and checked once, here, with a message naming the key, its value and the rule.
- Made by the run plan in a run (`RolloutPlan.engine_config`: sizes from the plan, switches from the rollout
  section); tests and benchmarks build one directly.
- Two fields default to the model: `max_model_len` (its max_position_embeddings) and `eos_token_ids` (its
  eos_token_id). `for_model` fills them in, and the engine hands that resolved copy on.
- The KV cache size of one wake can differ from `num_kv_blocks` (a hybrid engine allocates each call's need):
  `LLMEngine.wake_up(..., num_kv_blocks=...)` takes it, so the config itself never changes.
- `speculative` (SpeculativeConfig): lossless n-gram speculative decoding in the tail of a rollout
  (rollout/ngram_draft.py proposes, rollout/spec_verify.py accepts); off by default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding with drafts looked up in the sequence's own and its siblings' tokens."""
    enable: bool = False
    num_draft_tokens: int = 4       # draft tokens proposed per sequence and verify step at most
    min_match: int = 2              # shortest suffix of a sequence looked up in the index
    max_match: int = 4              # longest suffix looked up (the longest match wins)
    max_running_seqs: int = 16      # speculate only while at most this many sequences run (memory-bound steps)

    def check(self) -> None:
        rules = [
            ("num_draft_tokens", self.num_draft_tokens, self.num_draft_tokens >= 1, ">= 1"),
            ("min_match", self.min_match, self.min_match >= 1, ">= 1"),
            ("max_match", self.max_match, self.max_match >= self.min_match, f">= min_match ({self.min_match})"),
            ("max_running_seqs", self.max_running_seqs, self.max_running_seqs >= 1, ">= 1"),
        ]
        for key, value, ok, rule in rules:
            if not ok:
                raise ValueError(f"rollout engine: speculative.{key}={value!r} must be {rule}")


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16                    # tokens per KV block
    max_num_seqs: int = 1024                # sequences running at once
    max_num_batched_tokens: int = 8192      # tokens computed per prefill step; a prompt is prefilled in one step
    max_model_len: int | None = None        # prompt + completion tokens at most; None: the model's
                                            # max_position_embeddings
    gpu_memory_utilization: float = 0.5     # this engine's weights, KV and activations within that fraction of
                                            # the GPU (vLLM's per-instance meaning; see model_runner.kv_budget_bytes)
    num_kv_blocks: int | None = None        # the KV cache (capped on GPUs by gpu_memory_utilization); None: as
                                            # many blocks as gpu_memory_utilization allows (GPUs only)
    enforce_eager: bool = False             # no CUDA graphs for decode steps
    enable_prefix_sharing: bool = True      # the n samples of a prompt share its KV blocks and its prefill
    async_scheduling: bool = False          # decode step t+1 is scheduled and launched before step t is read
    eos_token_ids: tuple[int, ...] | None = None    # tokens that end a sequence; None: the model's eos_token_id
    dtype: torch.dtype = torch.bfloat16     # engine weights and KV cache
    speculative: SpeculativeConfig = SpeculativeConfig()
    record_routed_experts: bool = False     # MoE models: record each token's experts per MoE layer and return them
                                            # with the completions (routing replay, actor.router_replay.mode=R3)

    def __post_init__(self):
        n, bt, kv = self.max_model_len, self.max_num_batched_tokens, self.num_kv_blocks
        rules = [
            ("block_size", self.block_size, self.block_size >= 1, ">= 1"),
            ("gpu_memory_utilization", self.gpu_memory_utilization, 0 < self.gpu_memory_utilization <= 1,
             "in (0, 1]"),
            ("max_num_seqs", self.max_num_seqs, self.max_num_seqs >= 1, ">= 1"),
            ("max_num_batched_tokens", bt, n is None or bt >= n,
             f">= max_model_len ({n}), since a prompt is prefilled in one step"),
            ("num_kv_blocks", kv, kv is None or kv >= 1, "None or >= 1"),
        ]
        for key, value, ok, rule in rules:
            if not ok:
                raise ValueError(f"rollout engine: {key}={value!r} must be {rule}")
        self.speculative.check()

    @property
    def max_decode_rows(self) -> int:
        """Rows a decode step may have: one per running sequence, and with speculation one more per draft token of
        each of at most max_running_seqs sequences (host buffers, graph buckets and sampling are sized to it)."""
        spec = self.speculative
        if not spec.enable:
            return self.max_num_seqs
        return max(self.max_num_seqs, min(self.max_num_seqs, spec.max_running_seqs) * (spec.num_draft_tokens + 1))

    def for_model(self, hf_config) -> EngineConfig:
        """This config with the fields left to the model filled in from its HF config (validated again)."""
        eos = hf_config.eos_token_id if self.eos_token_ids is None else self.eos_token_ids
        return replace(self, max_model_len=self.max_model_len or hf_config.max_position_embeddings,
                       eos_token_ids=token_ids(eos))


def token_ids(value) -> tuple[int, ...]:
    """An HF eos_token_id spelling (an id, a list of ids, or None) as a tuple of ids."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)
