"""The rollout's part of the run plan: the KV cache each engine needs for this step's batch (and validation's) and
the concurrency it allows (`plan_kv_cache`, first: the training passes of a resident engine plan next to that
cache), then the engine's dtype, prefill budget, scheduling, speculative decoding and partial rollouts
(`plan_rollout`, last, once every phase's peak is known). The engine gets them as one `EngineConfig`
(`RolloutPlan.engine_config`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hybridrl.config.errors import ConfigError
from hybridrl.config.sections.rollout import RolloutConfig, SpeculativeDecodingConfig
from hybridrl.plan.cascade import CascadeForecast, forecast_cascade
from hybridrl.plan.memory import GiB, MemoryModel, Residency
from hybridrl.plan.partial_rollout import PartialRolloutPlan, cohorts_in_flight, plan_partial_rollout
from hybridrl.plan.sizing import ACTOR_FSDP, SAFETY, DeviceSpec, Sizing, is_auto
from hybridrl.rollout.config import EngineConfig, SpeculativeConfig
from hybridrl.training.fsdp import resolve_dtype

ROLLOUT = "actor_rollout_ref.rollout"
SPEC_ROWS_FALLBACK = 64         # verify rows per step where the device's peaks are unknown (CPU, other GPUs)


@dataclass(frozen=True)
class KvCachePlan:
    blocks: int                 # per engine (one TP rank): the largest call's need; capped at wake on GPUs
    blocks_unshared: int        # the same batch without prompt sharing
    max_num_seqs: int           # sequences running at once (fewer than configured where ignore_eos and the cache
                                # does not hold them all at full length)
    bytes: int                  # `blocks` in bytes
    prompt_len: int             # the rule of blocks_for: the longest prompt and response, block size, sharing
    response_len: int
    block_size: int
    prefix_sharing: bool

    def blocks_for(self, prompts: int, n: int, continuations: int = 0) -> int:
        """KV blocks one generate call of `prompts` x n (and `continuations` single samples: partial rollouts) needs
        on this engine (a hybrid engine allocates its KV per call, so a validation batch larger than the training one
        does not inflate every training step)."""
        need = sum(kv_need(p, k, self.prompt_len, self.response_len, self.block_size, self.prefix_sharing,
                           self.max_num_seqs)[0] for p, k in ((prompts, n), (continuations, 1)))
        return max(1, min(need, self.blocks))


@dataclass(frozen=True)
class RolloutPlan:
    dtype: str                          # bf16 | fp16 | fp32: engine weights and KV (fp32 on CPU)
    kv_cache: KvCachePlan
    max_num_batched_tokens: int         # the engine's prefill budget: at least max_model_len
    async_scheduling: bool              # rollout.async_scheduling resolved (auto: on on GPUs)
    speculative: SpeculativeConfig      # rollout.speculative, max_running_seqs resolved
    partial: PartialRolloutPlan | None  # rollout.partial_rollout resolved; None: off
    hybrid: bool                        # scheme B (engine sleeps between rollouts) or A (resident engine)
    reshard_strategy: str
    record_routed_experts: bool         # actor.router_replay.mode=R3: the engine records each token's experts
    borrowed_params: int = 0            # weights the hybrid engine uses in place from the actor (no engine copy)
    expert_lora: str | None = None      # LoRA on MoE experts in the engine: 'unmerged' (base borrowed, the engine
                                        # adds the low-rank term), 'merged' (its own merged copies); None: none
    engine_adapter_params: int = 0      # 'unmerged': the engine's per-expert factors (rank padded to 16 bytes)
    cascade: CascadeForecast | None = None  # cascade decode at the step's longest prompts (plan/cascade.py)

    @property
    def borrow_weights(self) -> bool:
        return self.borrowed_params > 0

    def engine_config(self, rollout: RolloutConfig, eos_token_ids: tuple[int, ...] | None = None) -> EngineConfig:
        """The native rollout engine's config: its sizes, dtype and scheduling from this plan, the rest from the
        `actor_rollout_ref.rollout` section; `eos_token_ids` None leaves them to the model's config."""
        return EngineConfig(
            block_size=rollout.block_size, max_num_seqs=self.kv_cache.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=rollout.prompt_length + rollout.response_length,
            gpu_memory_utilization=rollout.gpu_memory_utilization, num_kv_blocks=self.kv_cache.blocks,
            enforce_eager=rollout.enforce_eager, enable_prefix_sharing=rollout.enable_prefix_sharing,
            async_scheduling=self.async_scheduling, eos_token_ids=eos_token_ids,
            record_routed_experts=self.record_routed_experts,
            dtype=resolve_dtype(self.dtype, "plan.rollout.dtype"), speculative=self.speculative)

    def describe(self) -> list[str]:
        """The rollout's lines of `hybridrl config check`."""
        kv = self.kv_cache
        return [f"kv cache        {kv.blocks} blocks per engine ({kv.blocks_unshared} without prompt "
                f"sharing), {kv.max_num_seqs} sequences at most",
                f"rollout engine  prefill budget {self.max_num_batched_tokens} tokens per step, decode steps "
                + ("launched ahead (async scheduling)" if self.async_scheduling else "one at a time")
                + "; per step it logs the tail's share of its time and its bandwidth floor",
                f"speculative     {_describe_speculative(self.speculative)}",
                *([str(self.cascade)] if self.cascade is not None else []),
                *([f"engine weights  {self.borrowed_params / 1e9:.3f}B parameters used in place from the actor's "
                   "own tensors (no engine copy): the engine holds only the rest"] if self.borrow_weights else []),
                *([_describe_expert_lora(self.expert_lora, self.engine_adapter_params)] if self.expert_lora else []),
                *([str(self.partial)] if self.partial is not None else [])]


def _describe_expert_lora(mode: str, adapter_params: int) -> str:
    if mode == "unmerged":
        return (f"experts         base borrowed, LoRA applied unmerged: the engine holds only the adapters' factors "
                f"({adapter_params / 1e6:.2f}M parameters) and adds scaling·(x A_e^T) B_e^T beside x W_e^T")
    return ("experts         LoRA merged: the engine holds its own W + scaling·B·A of each adapted expert tensor "
            "(unmerged needs the engine to borrow the base: hybrid scheme, TP = 1, one actor rank, the engine's dtype, "
            "no param_offload)")


def kv_need(prompts: int, n: int, prompt_len: int, response_len: int, block_size: int, sharing: bool,
            max_num_seqs: int) -> tuple[int, int]:
    """KV blocks one engine needs for `prompts` × n samples at the longest lengths, with and without prompt
    sharing (the full blocks of a prompt are shared by its n samples; the partial one is copied on write).
    At most max_num_seqs sequences run at once, which bounds the need of larger batches."""
    per_seq = -(-(prompt_len + response_len) // block_size)
    unshared = prompts * n * per_seq
    shared_blocks = prompt_len // block_size if (sharing and n > 1) else 0
    shared = prompts * shared_blocks + prompts * n * (per_seq - shared_blocks)
    cap = max_num_seqs * per_seq
    return min(shared, cap), min(unshared, cap)


def step_samples(sizing: Sizing) -> int:
    """Samples one engine's training call holds at most: the step's fresh ones, and with partial rollouts those
    carried from earlier steps (plan/partial_rollout.cohorts_in_flight)."""
    return sizing.layout.rollout_samples_per_dp * cohorts_in_flight(sizing.get, sizing.response_len)


def kv_demand(sizing: Sizing, val_prompts: int | None, judge: bool) -> tuple[int, int, int, int]:
    """(blocks, blocks_unshared, step, seqs): the KV blocks per engine of the largest generate call (the step's,
    validation's, the judge's) with and without prompt sharing, those this step's rollout holds (a hybrid engine
    allocates per call: the training call's; a resident one: the largest), and the sequences to run at once."""
    get, layout = sizing.get, sizing.layout
    block_size, sharing = get(f"{ROLLOUT}.block_size"), get(f"{ROLLOUT}.enable_prefix_sharing")
    samples = layout.rollout_samples_per_dp
    carried = step_samples(sizing) - samples
    val_n = get(f"{ROLLOUT}.val_kwargs.n")
    val_per_dp = -(-(val_prompts or 0) // layout.rollout_dp)
    seqs = min(get(f"{ROLLOUT}.max_num_seqs"), max(samples + carried, val_per_dp * val_n))
    if carried:
        sizing.choices.append(
            f"partial rollouts: an engine runs up to {samples + carried} sequences at once ({samples} fresh and up "
            f"to {carried} carried from earlier steps), KV planned for them"
            + (f"; {ROLLOUT}.max_num_seqs = {seqs} makes the rest wait their turn"
               if seqs < samples + carried else ""))

    def need(prompts: int, n: int) -> tuple[int, int]:
        return kv_need(prompts, n, sizing.prompt_len, sizing.response_len, block_size, sharing, seqs)

    train, train_unshared = need(layout.rollout_prompts_per_dp, layout.n)
    if carried:   # carried samples are single sequences, each up to the full length; within the concurrency's need
        cap = seqs * -(-sizing.seq_len // block_size)
        more, more_unshared = need(carried, 1)
        train, train_unshared = min(cap, train + more), min(cap, train_unshared + more_unshared)
    val, val_unshared = need(val_per_dp, val_n)
    blocks, unshared = max(train, val), max(train_unshared, val_unshared)
    if judge:  # the judge's call: one prompt per sample (prompt + verdict within P + R), nothing shared
        judge_blocks = need(samples, 1)[0]
        train, blocks = max(train, judge_blocks), max(blocks, judge_blocks, val_unshared)
        unshared = max(unshared, judge_blocks)
    return blocks, unshared, train if sizing.residency.hybrid else blocks, seqs


def kv_room(sizing: Sizing, memory: MemoryModel, residency: Residency, seqs: int) -> int:
    """KV blocks per engine that fit the device budget beside everything else the rollout (and a resident engine's
    training passes) hold, with `seqs` sequences at once, and within `gpu_memory_utilization`'s ceiling."""
    get, seq_len = sizing.get, sizing.seq_len
    block_size, rows = get(f"{ROLLOUT}.block_size"), min(seqs, step_samples(sizing))
    prefill = min(get(f"{ROLLOUT}.max_num_batched_tokens"), seqs * seq_len)
    room = _kv_room(memory, residency, sizing.budget, block_size, seq_len, sizing.response_len, rows, prefill)
    if sizing.device.total_bytes is None:
        return room
    return min(room, _kv_ceiling(memory, get(f"{ROLLOUT}.gpu_memory_utilization") * sizing.device.total_bytes,
                                 block_size, rows, prefill))


def _kv_ceiling(mm: MemoryModel, engine_bytes: float, block_size: int, rows: int, prefill: int) -> int:
    """KV blocks the engine takes at most when it wakes (ModelRunner.wake_kv, vLLM's per-instance meaning of
    gpu_memory_utilization): its own weights, KV and activation peak within utilization x the GPU."""
    parts = mm.gen(0, block_size, rows, prefill).parts
    own = parts["engine weights"] + parts["prefill activations"] + parts["sampling"] + parts["cuda graphs"]
    return max(0, int(engine_bytes - own) // mm.kv_block_bytes(block_size))


def sequences_at_full_length(sizing: Sizing, room: int, blocks: int, seqs: int) -> int:
    """How many of `seqs` sequences `room` KV blocks hold at full length where the call needs `blocks` for all of
    them: all where it fits, else as many as fit (0: not even one, and the rollout phase is refused)."""
    per_seq = -(-sizing.seq_len // sizing.get(f"{ROLLOUT}.block_size"))
    return seqs if room >= blocks else min(seqs, room // per_seq)


def plan_kv_cache(sizing: Sizing, val_prompts: int | None, judge: bool) -> KvCachePlan:
    """The KV blocks of the largest generate call (the step's, validation's, the judge's) and the engine's
    concurrency. Where the cache that fits the GPU next to everything else holds fewer sequences at full length than
    the call runs: with `ignore_eos` (every sequence reaches the limit) fewer run at once and the rest queue; else all
    run at once, as vLLM schedules them, and the engine preempts by recompute if the cache runs out (long-tailed
    lengths seldom fill it: a 7B at 16k, mean 3.5-3.9k, used 13k of 62k blocks at 92 at once). Nothing is refused
    while one sequence fits. Predicts the rollout phase (`gen`)."""
    get, memory, residency = sizing.get, sizing.memory, sizing.residency
    seq_len, block_size = sizing.seq_len, get(f"{ROLLOUT}.block_size")
    blocks, unshared, step, seqs = kv_demand(sizing, val_prompts, judge)
    if sizing.budget is not None:
        room = kv_room(sizing, memory, residency, seqs)
        fitting = sequences_at_full_length(sizing, room, blocks, seqs)
        if 0 < fitting and room < blocks:
            if get(f"{ROLLOUT}.ignore_eos"):
                sizing.choices.append(
                    f"kv cache = {room} blocks, {room / blocks:.0%} of the step's need of {blocks}: at most {fitting} "
                    f"sequences at once (of {seqs}; {ROLLOUT}.max_num_seqs), the rest wait their turn (with "
                    f"{ROLLOUT}.ignore_eos every sequence reaches the limit); more GPUs or "
                    f"'{ROLLOUT}.tensor_model_parallel_size' for full concurrency")
                seqs = fitting
            else:
                sizing.choices.append(
                    f"kv cache = {room} blocks, {room / blocks:.0%} of the step's need of {blocks} if every sequence "
                    f"reached the limit together ({fitting} of {seqs} could): all {seqs} run at once, since "
                    f"responses that end at EOS seldom all run long; where the cache runs out the engine preempts the "
                    f"sequence admitted last and recomputes it later (rollout/num_preemptions). "
                    f"{ROLLOUT}.max_num_seqs={fitting} keeps the worst case instead")
            blocks, step = room, min(step, room)
    prefill = min(get(f"{ROLLOUT}.max_num_batched_tokens"), seqs * seq_len)
    sizing.predicted["gen"] = memory.gen(step, block_size, min(seqs, step_samples(sizing)), prefill)
    return KvCachePlan(blocks=blocks, blocks_unshared=unshared, max_num_seqs=seqs,
                       bytes=blocks * memory.kv_block_bytes(block_size), prompt_len=sizing.prompt_len,
                       response_len=sizing.response_len, block_size=block_size,
                       prefix_sharing=get(f"{ROLLOUT}.enable_prefix_sharing"))


def _kv_room(mm: MemoryModel, res: Residency, budget: float, block_size: int, seq_len: int, response_len: int,
             rows: int, prefill: int) -> int:
    """KV blocks that fit the budget next to everything else of the phases that hold the cache: the rollout, and
    for a resident engine (scheme A) also the update and log-prob passes at one row per micro-batch."""
    peaks = [mm.gen(0, block_size, rows, prefill).total]
    if not res.hybrid:
        peaks += [mm.update_actor(1, seq_len, response_len, 0).total,
                  mm.log_prob("old_log_prob", 1, seq_len, response_len, False, 0).total]
    return max(0, int((budget - max(peaks)) // mm.kv_block_bytes(block_size)))


def plan_rollout(sizing: Sizing, kv_cache: KvCachePlan, dtype: str) -> RolloutPlan:
    """The rollout engine's plan around its KV cache, once every phase is planned: refuses a rollout phase that
    does not fit the GPU, then resolves the engine's scheduling, speculative decoding and partial rollouts."""
    get, device, predicted, layout = sizing.get, sizing.device, sizing.predicted, sizing.layout
    if sizing.budget is not None and predicted["gen"].total > sizing.budget:
        # the actor's offloads act in the hybrid scheme only; one the plan weighed itself ('auto') is not repeated
        offloads = [k for k, held in (("param_offload", "actor params"), ("optimizer_offload", "actor optimizer"))
                    if sizing.residency.hybrid and predicted["gen"].parts.get(held, 0) > 0
                    and f"{ACTOR_FSDP}.{k}" not in sizing.weighed]
        raise ConfigError([f"rollout phase predicted at {predicted['gen'].total / GiB:.1f} GiB per GPU, over "
                           f"{SAFETY:.0%} of {device.total_bytes / GiB:.1f} GiB ({predicted['gen'].describe()}): "
                           f"raise '{ROLLOUT}.tensor_model_parallel_size'"
                           + (", lower 'data.train_batch_size', or set " + " / ".join(
                               f"'{ACTOR_FSDP}.{k}'" for k in offloads) + " = true" if offloads
                              else " or lower 'data.train_batch_size'")])
    speculative = resolve_speculative(get(f"{ROLLOUT}.speculative"), device, sizing.choices)
    par = layout.parallel
    critic_dp = [par.world_size // par.critic_sp] if layout.critic_mini_batch_per_gpu is not None else []
    partial = plan_partial_rollout(get, layout.n, layout.train_batch_size, [layout.train_dp] + critic_dp,
                                   sizing.choices)
    async_scheduling = get(f"{ROLLOUT}.async_scheduling")
    return RolloutPlan(
        dtype=dtype, kv_cache=kv_cache,
        max_num_batched_tokens=max(get(f"{ROLLOUT}.max_num_batched_tokens"), sizing.seq_len),
        async_scheduling=device.type != "cpu" if is_auto(async_scheduling) else bool(async_scheduling),
        speculative=speculative, partial=partial, hybrid=sizing.residency.hybrid,
        reshard_strategy=os.environ.get("HYBRIDRL_RESHARD", "slice"),
        record_routed_experts=sizing.residency.routing_record,
        borrowed_params=sizing.residency.engine_borrowed_params,
        expert_lora=None if not sizing.residency.lora_expert_bytes or get(f"{ROLLOUT}.name") != "native"
        else "unmerged" if sizing.residency.engine_borrowed_params else "merged",
        engine_adapter_params=sizing.residency.engine_adapter_params,
        cascade=forecast_cascade(sizing, kv_cache.max_num_seqs, resolve_dtype(dtype, "plan.rollout.dtype").itemsize)
        if get(f"{ROLLOUT}.name") == "native" else None)


def resolve_speculative(section: SpeculativeDecodingConfig, device: DeviceSpec, choices: list[str],
                        key: str = f"{ROLLOUT}.speculative") -> SpeculativeConfig:
    """`rollout.speculative` as the engine's SpeculativeConfig. max_running_seqs auto: speculate while a verify step
    (each running sequence with num_draft_tokens + 1 rows) has at most half the device's ridge point in rows — its
    bf16 FLOP/s over its HBM bytes/s, the batch at which a decode step's weight read stops dominating — so the step
    stays memory-bound and checking the drafts costs about what decoding one token does; SPEC_ROWS_FALLBACK rows
    where the peaks are unknown."""
    from hybridrl.device_peaks import peaks_of

    k = section.num_draft_tokens
    value = section.max_running_seqs
    if is_auto(value):
        peaks = peaks_of(device.name) if device.type == "cuda" else None
        rows = peaks.bf16_flops / peaks.hbm_bytes_per_s / 2 if peaks else SPEC_ROWS_FALLBACK
        value = max(1, int(rows // (k + 1)))
        if section.enable:
            choices.append(f"{key}.max_running_seqs = {value} (" + (
                f"{value} x {k + 1} verify rows within half {device.name}'s ridge point, {2 * rows:.0f} FLOP/byte"
                if peaks else f"{SPEC_ROWS_FALLBACK} verify rows: no known peaks for {device.name}") + ")")
    return SpeculativeConfig(enable=section.enable, num_draft_tokens=k, min_match=section.min_match,
                             max_match=section.max_match, max_running_seqs=value)


def _describe_speculative(spec: SpeculativeConfig) -> str:
    if not spec.enable:
        return "off (rollout.speculative.enable)"
    return (f"while <= {spec.max_running_seqs} sequences run, each decode step also checks up to "
            f"{spec.num_draft_tokens} draft tokens per sequence (the tokens that followed its last "
            f"{spec.min_match}-{spec.max_match} tokens in its prompt, own and sibling responses), accepted exactly "
            "(same distribution); multi-turn rollouts decode plainly")
