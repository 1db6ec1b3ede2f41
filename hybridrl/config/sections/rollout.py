"""`actor_rollout_ref.rollout`: the generation engine and its sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridrl.config.sections.actor import LOG_PROB_SIZES, LogProbPassConfig
from hybridrl.config.sections.base import Section
from hybridrl.config.sections.multi_turn import MultiTurnConfig
from hybridrl.config.sections.rules import Findings, world_text
from hybridrl.config.sections.values import Auto, Dtype

ROLLOUT = "actor_rollout_ref.rollout"


@dataclass(frozen=True)
class RolloutConfig(LogProbPassConfig):
    """`actor_rollout_ref.rollout`."""

    name: Literal["native", "hf"]
    """native (our paged-KV engine) | hf (transformers generate, any causal LM); vllm and sglang run on the native
    engine, with a warning"""
    mode: Literal["sync"]
    """sync = the driver waits for the whole batch (verl's default: async, its server mode, read as sync with a
    warning: the engine serves single-turn, multi-turn and agent-loop rollouts in one mode)"""
    temperature: float
    """sampling temperature (0 = greedy)"""
    top_k: int
    """-1 = off"""
    top_p: float
    """nucleus sampling mass"""
    do_sample: bool
    """false = greedy"""
    n: int
    """samples per prompt (GRPO group size: grpo and rloo compare a prompt's samples, so they need n > 1; PPO with gae
    may use 1; verl's default: 1)"""
    prompt_length: int
    """prompt tokens the engine accepts"""
    response_length: int
    """max generated tokens"""
    dtype: Dtype
    """engine weight and KV dtype"""
    gpu_memory_utilization: float
    """ceiling (vLLM's per-instance meaning): the engine's weights + KV + activations stay within this fraction of the
    GPU; the KV is sized by the run plan to this step's batch"""
    ignore_eos: bool
    """keep generating after eos (benchmarks)"""
    enforce_eager: bool
    """true = no CUDA graphs"""
    free_cache_engine: bool
    """sleep the engine after each rollout (hybrid engine)"""
    tensor_model_parallel_size: int
    """TP size of a generation engine; rollout dp = world / this (verl's default: 2)"""
    max_num_batched_tokens: int
    """token budget of one prefill step"""
    max_num_seqs: int
    """sequences decoded together at most. Where the KV cache that fits next to the training state cannot hold them
    all at full length, the run plan lowers it with ignore_eos (every sequence reaches the limit; the rest wait their
    turn) and keeps it otherwise: the engine then preempts the sequence admitted last by recompute if the cache runs
    out (rollout/num_preemptions; verl's default: 256)"""
    block_size: int
    """tokens per KV-cache block"""
    enable_prefix_sharing: bool
    """the n samples of a prompt share its KV blocks"""
    async_scheduling: Auto | bool
    """native engine: launch decode step t+1 before reading step t (hides the host's per-step work behind the GPU); auto
    = on on GPUs, off on CPU (where the synchronous loop is the reference)"""
    speculative: SpeculativeDecodingConfig
    seed: int
    """sampling seed, mixed with trainer.seed and the step, offset by the rollout dp rank (TP ranks of a group share
    it)"""
    partial_rollout: PartialRolloutConfig
    multi_turn: MultiTurnConfig
    val_kwargs: ValKwargsConfig

    def check_sizes(self, found: Findings) -> None:
        found.positive(self, ROLLOUT, ("n", "tensor_model_parallel_size", "block_size", "max_num_seqs",
                                       "max_num_batched_tokens", "val_kwargs.n"))
        found.positive_or_unset(self, ROLLOUT, LOG_PROB_SIZES)

    def check(self, cfg, found: Findings) -> None:
        """Rules of the rollout's keys (`cfg`: the whole PPOConfig, for the device mesh and the lengths)."""
        from hybridrl.models.tp_rules import model_tp_error

        if not 0 < self.gpu_memory_utilization <= 1:
            found.errors.append(f"'{ROLLOUT}.gpu_memory_utilization' must be in (0, 1], got "
                                f"{self.gpu_memory_utilization}")
        if not 0 < self.top_p <= 1:
            found.errors.append(f"'{ROLLOUT}.top_p' must be in (0, 1], got {self.top_p}")
        if self.temperature < 0:
            found.errors.append(f"'{ROLLOUT}.temperature' must be >= 0, got {self.temperature}")
        tp, per_node, world = self.tensor_model_parallel_size, cfg.trainer.n_gpus_per_node, cfg.trainer.world_size
        tbs = cfg.data.train_batch_size
        if tp > per_node:
            found.errors.append(f"'{ROLLOUT}.tensor_model_parallel_size' = {tp} must be <= trainer.n_gpus_per_node = "
                                f"{per_node} (a TP group may not span machines)")
        elif world % tp:
            found.errors.append(f"'{ROLLOUT}.tensor_model_parallel_size' = {tp} must divide the {world_text(cfg)}")
        elif tbs % (world // tp) and not (cfg.algorithm.filter_groups.enable and cfg.data.gen_batch_size):
            # with dynamic sampling the rollout splits data.gen_batch_size (its own rule, data.py); the collected
            # batch only trains
            found.errors.append(f"'data.train_batch_size' = {tbs} must be divisible by the rollout dp size "
                                f"(world {world} / tensor_model_parallel_size {tp} = {world // tp})")
        if self.name == "native":  # the model's heads bound the TP degree
            tp_error = model_tp_error(cfg.actor_rollout_ref.model.path, tp)
            found.errors += [tp_error] if tp_error else []
        elif tp > 1:
            found.errors.append(f"'{ROLLOUT}.name' = {self.name} generates with the whole model on each rank: "
                                f"'{ROLLOUT}.tensor_model_parallel_size' = {tp} needs rollout.name=native")
        self.check_log_prob_batches(ROLLOUT, cfg, found)
        self.multi_turn.check(self.name, found)
        self.speculative.check(self, found)
        self.partial_rollout.check(cfg, found)


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
    """opt-in, off-policy partial rollouts (Kimi k1.5, APRIL, AReaL): a step samples at most max_new_tokens_per_step new
    tokens per sample, carries unfinished samples into the next step (continued with the new weights), and trains a
    prompt group once all its n samples are done, with their rollout log-probs as the behaviour policy and truncated IS
    (algorithm.rollout_correction.rollout_is: token unless set); see docs/architecture.md"""
    max_new_tokens_per_step: int | None
    """the per-step token budget of one sample (required with enable; at >= response_length nothing is ever carried)"""
    max_staleness: int
    """steps a carried group may wait: a group first sampled more than this many steps before the step that would train
    it is dropped (counted: partial/dropped_stale); >= 1"""

    def check(self, cfg, found: Findings) -> None:
        """A budget that can carry something, a staleness limit, and the features partial rollouts cannot join."""
        pr = f"{ROLLOUT}.partial_rollout"
        if not self.enable:
            return
        budget, stale, length = self.max_new_tokens_per_step, self.max_staleness, cfg.data.max_response_length
        if budget is None or budget <= 0:
            found.errors.append(f"'{pr}.max_new_tokens_per_step' = {budget}: partial rollouts need a positive per-step "
                                "token budget")
        elif budget >= length:
            found.warnings.append(f"'{pr}.max_new_tokens_per_step' = {budget} >= data.max_response_length = {length}: "
                                  "no sample is ever carried, so partial rollouts change nothing")
        if stale < 1:
            found.errors.append(f"'{pr}.max_staleness' = {stale} must be >= 1 (0 would drop every carried group: set "
                                f"'{pr}.enable' = false instead)")
        elif budget is not None and 0 < budget < length and (stale + 1) * budget < length:
            found.warnings.append(f"'{pr}.max_new_tokens_per_step' = {budget} with max_staleness = {stale}: a sample "
                                  f"longer than {(stale + 1) * budget} tokens (of data.max_response_length = {length}) "
                                  "can never finish in time, so its group is always dropped (counted: "
                                  "partial/dropped_stale)")
        rollout, algorithm = cfg.actor_rollout_ref.rollout, cfg.algorithm
        conflicts = {f"{ROLLOUT}.name": (rollout.name, rollout.name != "native"),
                     f"{ROLLOUT}.multi_turn.enable": (rollout.multi_turn.enable, rollout.multi_turn.enable),
                     "algorithm.filter_groups.enable": (algorithm.filter_groups.enable, algorithm.filter_groups.enable),
                     "algorithm.adv_estimator": (algorithm.adv_estimator, algorithm.adv_estimator == "remax")}
        for key, (value, bad) in conflicts.items():
            if bad:
                found.errors.append(f"'{pr}.enable' = true does not go with '{key}' = {value} (partial rollouts need "
                                    "the native engine, single-turn samples, one generation batch a step and no greedy "
                                    "baseline rollout)")


@dataclass(frozen=True)
class SpeculativeDecodingConfig(Section):
    """`actor_rollout_ref.rollout.speculative`."""

    enable: bool
    """native engine: lossless speculative decoding in the rollout's tail — each decode step also checks draft tokens
    looked up in the sequence's prompt, its own and its siblings' responses (n-gram match), accepted so that the sampled
    distribution is unchanged; not for multi-turn rollouts. A speculating step gives up the next step's early launch
    and adds drafting and acceptance on the host, so it pays where a decode step is GPU-bound: on SmolLM2-135M it cut
    the decode steps by a third and ran at 0.80x the tokens/s (docs/benchmarks.md section 10)"""
    num_draft_tokens: int
    """draft tokens per sequence and step at most"""
    min_match: int
    """shortest suffix of a sequence's tokens looked up for a draft"""
    max_match: int
    """longest suffix looked up (the longest match wins)"""
    max_running_seqs: Auto | int
    """speculate only while at most this many sequences run; auto = the verify step's rows (sequences x
    (num_draft_tokens + 1)) within half the GPU's ridge point (FLOP/s over bytes/s), where a step is memory-bound"""

    def check(self, rollout: RolloutConfig, found: Findings) -> None:
        """Sizes of the n-gram drafts and the tail threshold (the engine's SpeculativeConfig has the same rules)."""
        sec = f"{ROLLOUT}.speculative"
        for key in ("num_draft_tokens", "min_match"):
            if getattr(self, key) < 1:
                found.errors.append(f"'{sec}.{key}' = {getattr(self, key)} must be >= 1")
        if self.max_match < self.min_match:
            found.errors.append(f"'{sec}.max_match' = {self.max_match} must be >= '{sec}.min_match' = {self.min_match}")
        most = self.max_running_seqs
        if most != "auto" and (isinstance(most, str) or most < 1):
            found.errors.append(f"'{sec}.max_running_seqs' = {most!r} must be 'auto' or an integer >= 1")
        if not self.enable:
            return
        if rollout.name != "native":
            found.warnings.append(f"'{sec}.enable' = true has no effect with '{ROLLOUT}.name' = {rollout.name} "
                                  "(the native engine speculates)")
        if rollout.multi_turn.enable:
            found.warnings.append(f"'{sec}.enable' = true with multi_turn.enable: multi-turn rollouts decode without "
                                  "speculation")
