"""LLMEngine: the native rollout engine with the vLLM-shaped API of docs/CONTRACTS.md.

Choices:
- One EngineConfig (rollout/config.py), with the model's defaults filled in, is what the runner and each call's
  scheduler read their sizes from; the run plan makes it (`RolloutPlan.engine_config`).
- `generate` starts the call (`_start`), runs `_step` until the call is done, and collects the outputs
  (`_outputs`). `_step` is nano-vllm's step: schedule a batch, run it on the model runner, postprocess its
  tokens. Beside it, in named methods: async scheduling's lookahead (`_launch_ahead`: the next decode launched
  before this one is read; the next step takes it from `call.ahead` instead of scheduling) and the multi-turn
  hooks (`_end_turns` after postprocessing: turn ends to the agent, known outcomes resumed; `_resume_ready`,
  waiting, when only paused sequences could move on). A call's state (`_Call`: its scheduler, generator,
  sequences, clocks, the step launched ahead, turns in flight) is passed to each of them.
- Lifecycle per RL step: wake_up(("weights",)) -> load_weights(...) -> wake_up(("kv_cache",), num_kv_blocks) ->
  generate(...) -> sleep(). `num_kv_blocks` sizes this wake's cache (None: the config's); `generate` wakes the
  KV cache itself if the caller did not. Weights can be loaded any number of times (every step is a weight
  update); before the first generate after a weights wake-up every parameter (and fused shard) must have been
  loaded, else ValueError lists the missing ones — a half-loaded model must not generate silently.
- A fresh BlockManager/Scheduler per generate call: nothing survives across calls (the prefix cache
  is reset by construction, which the hybrid engine needs since weights change every step).
- TP ranks sample the same tokens without a broadcast: logits are all-gathered (identical on every
  rank) and every rank seeds its generator with the same seed.
- `stats` describes the last generate call (counters restart at each call): prefill/decode steps, preemptions,
  copy-on-write copies, kv_blocks_peak vs kv_blocks_peak_unshared, bytes per block, graph capture time,
  and where the wall time went (host clocks only, no extra syncs): `schedule_s` (scheduler +
  postprocess), `{prefill,decode}_launch_s` (building inputs and enqueueing the step) and
  `{prefill,decode}_wait_s` (blocked on the step's one device->host read of the sampled tokens,
  i.e. the GPU time not hidden behind the host work). The tail: `decode_s` (wall time of decode steps),
  `tail_time_frac` (the share of the call's wall time in steps with fewer than TAIL_FRACTION of its sequences
  still running), `running_seqs_mean` (sequences per decode step, the mean over steps) and, on GPUs
  with known peaks (device_peaks.py), `decode_floor_s`: each decode step's unavoidable bytes (this rank's engine
  weights once, plus the running sequences' K/V, blocks that several of them share — a prompt's, for its samples —
  once) over the HBM bandwidth, summed.
- Routing record (`record_routed_experts`, MoE models): each finished sequence's experts are gathered on the
  device as it finishes (the scheduler's `on_finish`, before its blocks are freed), moved to the host together
  once the call ends, and returned in its CompletionOutput's `routed_experts`.
- One SamplingParams per generate call is handed to the runner, which builds the sampling tensors
  and host-side path flags once per call instead of per step.
- `async_scheduling`: while decode step t runs on the GPU, step t+1 is scheduled and launched (its input
  tokens gathered on the device from step t's samples), then step t is read and post-processed — the
  host's per-step work hides behind the GPU instead of idling it. Greedy outputs, and sampled ones when no
  sequence ends on an eos/stop token, equal the synchronous loop's; otherwise a sequence that ends in step
  t costs one discarded sample in step t+1, which shifts the random stream (same distribution).
- Multi-turn (`generate(..., agent=...)`, see rollout/multi_turn.py): a sequence whose sampled token ends an
  assistant turn (`agent.ends_turn`) pauses with its KV blocks kept; `agent.on_turn_end(seq, budget)` returns a
  Future (the tools run on the agent's threads while the engine keeps decoding the other sequences) resolving to
  the tokens to append (tool messages in the chat template) or a finish reason. When it resolves the sequence
  is resumed: only its last sampled token and the appended tokens are prefilled, onto its own blocks. `budget`:
  how many tokens may be appended while leaving room for at least one more sampled token (max_tokens bounds
  model and appended tokens together, as does max_model_len: the plan sizes the KV for prompt + response, and no
  trajectory grows past it). A trajectory ended mid-turn by either is marked in its stats (`cut`: "max_tokens" or
  "max_model_len"), beside the agent's own cuts. Under TP only rank 0 of the engine's group runs the
  agent; the outcomes known at a step, and the trajectories' stats at the end, are broadcast over that group
  (turn_sync.py), so every rank resumes the same sequences at the same step.
- Speculative decoding (`config.speculative.enable`; not for multi-turn calls, whose injected tool tokens would
  need their own bookkeeping): each call gets an NgramDrafter over its groups; decode steps with at most
  `speculative.max_running_seqs` sequences verify the drafts (scheduler.py, model_runner.py, spec_verify.py), so
  a step can emit several tokens per sequence with the sampled distribution unchanged. Such steps are read before
  the next is scheduled (async scheduling's lookahead is declined in that regime while drafts keep coming; see
  scheduler.py). `stats` counts `spec_verify_steps`, `spec_draft_tokens`, `spec_accepted_tokens`,
  `spec_drafted_seqs`, `spec_emitted_tokens`, `spec_discarded_tokens` (emitted past a stop or length end),
  `spec_probe_steps` (steps read before the next only to ask the drafter again) and derives `spec_acceptance_rate`,
  `spec_mean_acceptance_length` (tokens emitted per drafted sequence and step) and `spec_tokens_per_verify_step`.
- Finished groups as they finish (the early update, workers/early_update.py): `generate(..., on_group_done=fn)`
  calls fn between steps with each prompt's RequestOutput once all its samples have finished (the scheduler's
  `on_finish` counts them per group), and `unfinished_seqs` / `call_seqs` say how many of the call's samples are
  still running, for a thread that waits for the rollout's tail.
- Partial rollouts: `SamplingParams.token_budget` stops a sequence after that many new tokens in the call
  (finish_reason BUDGET, reported like a finished one); `generate(..., continuations=...)` goes on from such samples:
  each is prefilled whole (prompt + its earlier tokens; the KV of the earlier call did not survive it, and the
  weights may have changed since) and decodes on from there, so with unchanged weights and greedy sampling the
  tokens are those of an uninterrupted call.
"""

from __future__ import annotations

import queue
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hybridrl.models.decoder import check_supported
from hybridrl.models.moe import not_routed
from hybridrl.rollout.block_manager import BlockManager
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.model_runner import ModelRunner, StepHandle, TokenFeed
from hybridrl.rollout.ngram_draft import NgramDrafter
from hybridrl.rollout.sampling_params import CompletionOutput, Continuation, RequestOutput, SamplingParams
from hybridrl.rollout.scheduler import PEAK_STATS, SPEC_COUNTERS, ScheduledBatch, Scheduler
from hybridrl.rollout.sequence import Sequence
from hybridrl.rollout.turn_sync import TurnSync

TAIL_FRACTION = 0.1     # a decode step with fewer than this share of the call's sequences running is in the tail
_Launched = tuple[ScheduledBatch, StepHandle]   # a step launched on the device, not read yet


class LLMEngine:
    def __init__(self, hf_config, config: EngineConfig, *, tp_group=None, device=None):
        """`config` with the model's defaults filled in (EngineConfig.for_model) is what the runner and each call's
        scheduler read their sizes from."""
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.hf_config = hf_config
        self.config = config.for_model(hf_config)
        check_supported(hf_config, max_model_len=self.config.max_model_len)
        self.runner = ModelRunner(hf_config, self.config, tp_group=tp_group, device=device)
        self._loaded: set = set()
        self.stats: dict = {}
        # the running call's samples and those not finished yet, 0 between calls (read by other threads: the early
        # update waits for the rollout's tail); an agent's branches are not counted
        self.call_seqs = self.unfinished_seqs = 0
        self.reset_stats()

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The tokens that end a sequence (the hf backend has the same attribute)."""
        return self.config.eos_token_ids

    def reset_stats(self) -> None:
        self.stats = {"num_prefill_steps": 0, "num_decode_steps": 0, "num_preemptions": 0, "num_cow_copies": 0,
                      "num_lookahead_steps": 0, "num_lookahead_discarded": 0,
                      "prefill_tokens_computed": 0, "generated_tokens": 0, "kv_blocks_peak": 0,
                      "kv_blocks_peak_unshared": 0, "num_kv_blocks": self.runner.num_blocks,
                      "kv_block_bytes": self.runner.block_bytes(), "weights_ignored": 0,
                      "cuda_graph_capture_s": self.runner.last_capture_s, "schedule_s": 0.0, "decode_s": 0.0,
                      "tail_time_frac": 0.0, "running_seqs_mean": 0.0, **dict.fromkeys(SPEC_COUNTERS, 0)}
        self.runner.counters = dict.fromkeys(self.runner.counters, 0.0)
        self.stats.update(self.runner.counters)

    # ------------------------------------------------------------------ memory phases
    def wake_up(self, tags=("weights", "kv_cache"), num_kv_blocks: int | None = None,
                borrowed: Iterable[str] = ()) -> None:
        """Allocate the engine's weights and/or KV cache. `num_kv_blocks`: this wake's cache size (a hybrid engine
        allocates each call's need); None: the config's. Either is capped on GPUs by gpu_memory_utilization.
        `borrowed`: HF names of weights the caller will pass in the engine's layout and dtype and keep unchanged
        until `sleep` (each must be `borrowable`); they are used in place, not copied."""
        unknown = set(tags) - {"weights", "kv_cache"}
        if unknown:
            raise ValueError(f"wake_up: tags {sorted(unknown)} unknown (allowed: 'weights', 'kv_cache')")
        if "weights" in tags and not self.runner.weights_awake:
            ours = set()
            for hf_name in borrowed:
                name = self.runner.model.borrowable(hf_name)
                if name is None:
                    raise ValueError(f"wake_up: {hf_name!r} cannot be borrowed: the engine holds it fused with "
                                     "another tensor or sliced by tensor parallelism")
                ours.add(name)
            self.runner.wake_weights(frozenset(ours))
            self._loaded = set()
        if "kv_cache" in tags:
            if not self.runner.weights_awake:
                raise RuntimeError("wake_up(('kv_cache',)) before the weights: wake weights first (the order "
                                   "that avoids the wake-up OOM)")
            self.runner.wake_kv(self.config.num_kv_blocks if num_kv_blocks is None else num_kv_blocks)
            self.stats["num_kv_blocks"] = self.runner.num_blocks
            self.stats["cuda_graph_capture_s"] = self.runner.last_capture_s

    def sleep(self, level: int = 1, clear_workspaces: bool = True) -> None:
        """Free KV cache, CUDA graphs and engine weights (level is accepted for vLLM parity); `clear_workspaces`
        false keeps cuBLAS's workspaces (another thread may be training with them)."""
        self.runner.sleep(clear_workspaces)
        self._loaded = set()

    # ------------------------------------------------------------------ weights
    def weight_shard_spec(self, hf_name: str, full_shape) -> tuple[int, int, int] | None:
        return self.runner.model.hf_weight_shard_spec(hf_name, tuple(full_shape))

    def weight_borrowable(self, hf_name: str, full_shape) -> bool:
        """Whether the engine holds the HF tensor whole in HF's layout, so a caller holding it in the engine's dtype
        and device can lend it (`wake_up(borrowed=...)`) instead of having it copied."""
        return self.runner.model.borrowable(hf_name, tuple(full_shape)) is not None

    def set_expert_adapters(self, adapters: dict[str, tuple[int, float]]) -> dict[str, tuple[str, str]]:
        """LoRA on MoE experts computed unmerged: each experts tensor named (HF name -> (rank, scaling)) keeps its
        base as loaded (borrowed, typically) and adds scaling·(x A_e^T) B_e^T beside it (models/moe.py). -> HF name ->
        the names its factors A [E, r, in] and B [E, out, r] must be loaded under, with every wake's weights.
        Called while the weights sleep (the factors are allocated with the rest at wake); idempotent."""
        if self.runner.weights_awake:
            raise RuntimeError("set_expert_adapters while the engine's weights are awake: call it before wake_up")
        return {name: self.runner.model.add_expert_adapter(name, rank, scaling)
                for name, (rank, scaling) in adapters.items()}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        if not self.runner.weights_awake:
            raise RuntimeError("load_weights before wake_up(('weights',))")
        count = 0
        for name, tensor in weights:
            key = self.runner.model.load_hf_weight(name, tensor)
            if key is None:
                self.stats["weights_ignored"] += 1
            else:
                self._loaded.add(key)
                count += 1
        return count

    def _check_loaded(self) -> None:
        missing = self.runner.model.expected_weight_keys() - self._loaded
        if missing:
            shown = sorted(f"{n}[{s}]" if s is not None else n for n, s in missing)[:8]
            raise ValueError(f"generate: {len(missing)} weights were never loaded since wake_up, e.g. {shown}")

    # ------------------------------------------------------------------ generation
    def _validate(self, prompts, params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        c = self.config
        if c.enable_prefix_sharing and params.n > c.max_num_seqs:
            raise ValueError(f"SamplingParams.n={params.n} exceeds max_num_seqs={c.max_num_seqs}: the n samples "
                             "of a prompt are admitted together when enable_prefix_sharing is on")
        V = self.hf_config.vocab_size
        for i, p in enumerate(prompts):
            if len(p) == 0 or len(p) >= c.max_model_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens; it must have 1..max_model_len-1 "
                                 f"({c.max_model_len - 1}) tokens")
            if min(p) < 0 or max(p) >= V:
                raise ValueError(f"prompt {i} has token ids outside [0, vocab_size={V})")

    def generate(self, prompt_token_ids: list[list[int]], sampling_params: SamplingParams,
                 agent=None, continuations: list[Continuation] = (), on_group_done=None) -> list[RequestOutput]:
        """Generate `sampling_params.n` samples per prompt; with `agent`, multi-turn (see the module docstring).
        `continuations` (partial rollouts): samples of earlier calls to go on from, one sample each, returned after
        the prompts' outputs with their earlier tokens and log-probs included. `on_group_done(output)`: called in
        this thread, between steps, with a prompt's (or continuation's) RequestOutput as soon as all its samples
        have finished, while the others still decode; the returned list holds every output all the same."""
        if on_group_done is not None and agent is not None:
            raise ValueError("generate: on_group_done does not go with a multi-turn agent (its branches can add "
                             "samples to a group after the group's samples have finished)")
        call = self._start(prompt_token_ids, sampling_params, agent, continuations)
        call.on_group_done = on_group_done
        while not call.done():
            self._step(call)
            self._report_done_groups(call)
        self.call_seqs = self.unfinished_seqs = 0
        return self._outputs(call)

    def _report_done_groups(self, call: _Call) -> None:
        """Hand each group whose samples have all finished since the last step to the call's on_group_done."""
        while call.done_groups:
            rid = call.done_groups.pop(0)
            if call.on_group_done is not None:
                group = call.groups[rid]
                experts = self._routed_experts(call, group)
                call.on_group_done(RequestOutput(rid, list(call.prompts[rid]),
                                                 [self._completion(s, None, experts.get(s.seq_id)) for s in group]))

    def _validate_continuations(self, continuations: list[Continuation], params: SamplingParams, agent) -> None:
        if continuations and agent is not None:
            raise ValueError("generate: continuations (partial rollouts) do not go with a multi-turn agent")
        self._validate([c.prompt_token_ids for c in continuations], params)
        for i, c in enumerate(continuations):
            if len(c.logprobs) != len(c.token_ids):
                raise ValueError(f"continuation {i} has {len(c.token_ids)} tokens but {len(c.logprobs)} log-probs")
            if len(c.token_ids) >= params.max_tokens or len(c.prompt_token_ids) + len(c.token_ids) >= \
                    self.config.max_model_len:
                raise ValueError(f"continuation {i} has {len(c.token_ids)} tokens after a prompt of "
                                 f"{len(c.prompt_token_ids)}: it must leave room for one more (max_tokens="
                                 f"{params.max_tokens}, max_model_len={self.config.max_model_len})")
            if c.token_ids and (min(c.token_ids) < 0 or max(c.token_ids) >= self.hf_config.vocab_size):
                raise ValueError(f"continuation {i} has token ids outside [0, vocab_size={self.hf_config.vocab_size})")

    def _start(self, prompts: list[list[int]], params: SamplingParams, agent,
               continuations: list[Continuation] = ()) -> _Call:
        """A generate call begun: its inputs and the loaded weights checked, the counters restarted, the KV
        cache woken if the caller did not, and the call's state made (`_new_call`)."""
        self._validate(prompts, params)
        self._validate_continuations(continuations, params, agent)
        self._check_loaded()
        self.reset_stats()
        if self.runner.kv is None:
            self.wake_up(("kv_cache",))
        return self._new_call(prompts, params, agent, continuations)

    def _new_call(self, prompts: list[list[int]], params: SamplingParams, agent,
                  continuations: list[Continuation]) -> _Call:
        """A call's scheduler over the whole KV cache with every prompt's samples and every continuation queued, and
        its seeded generator. A continuation is its own group: its tokens differ from its siblings'."""
        groups = []
        for rid, prompt in enumerate(prompts):
            group = [Sequence(prompt, params, rid, j) for j in range(params.n)]
            for s in group:
                s.group_id = group[0].seq_id
            groups.append(group)
        for rid, c in enumerate(continuations, start=len(prompts)):
            groups.append([Sequence(c.prompt_token_ids, params, rid, 0, carried=(c.token_ids, c.logprobs))])
        spec = self.config.speculative
        drafter = NgramDrafter(groups, spec) if spec.enable and agent is None else None
        experts: dict = {}
        unfinished = [len(g) for g in groups]
        done_groups: list[int] = []

        def finished(seq):   # before the scheduler frees its blocks: the routing record is read from them
            if self.config.record_routed_experts:
                experts[seq.seq_id] = self.runner.experts_of(seq)
            self.unfinished_seqs -= 1
            unfinished[seq.request_id] -= 1
            if unfinished[seq.request_id] == 0:
                done_groups.append(seq.request_id)
        sched = Scheduler(BlockManager(self.runner.num_blocks, self.config.block_size), self.config,
                          turn_end=agent.ends_turn if agent is not None else None, drafter=drafter,
                          on_finish=finished)
        self.call_seqs = self.unfinished_seqs = sum(map(len, groups))
        for group in groups:
            sched.add_group(group)
        gen = torch.Generator(device=self.runner.device)
        gen.manual_seed(params.seed if params.seed is not None else random.randrange(2**63))
        return _Call(sched, params, gen, groups,
                     _TailClock(sum(map(len, groups)), self.runner.decode_step_floor_s),
                     agent, TurnSync(self.runner.tp_group) if agent is not None else None, experts=experts,
                     prompts=[*prompts, *(c.prompt_token_ids for c in continuations)], done_groups=done_groups)

    def _step(self, call: _Call) -> None:
        """One step, as nano-vllm's: schedule a batch, run it on the model runner, postprocess its tokens.
        Async scheduling changes who launches it, not its shape: the step before may have launched this one
        already (`call.ahead`), and this one launches the next decode before reading its own samples
        (`_launch_ahead`). The turns it ends go to the agent in `_postprocess`; with nothing to run, it waits
        for a turn outcome (`_resume_ready`)."""
        t0 = time.perf_counter()
        launched = call.take_ahead() or self._schedule(call)
        if launched is None:  # only paused sequences can move on: wait for a turn outcome
            self._resume_ready(call, block=True)
            return
        batch, handle = launched
        call.ahead = self._launch_ahead(call, batch, handle)
        tokens, logprobs = self.runner.read(handle)
        self._postprocess(call, batch, tokens, logprobs)
        call.tail.step(batch, t0, handle.kv_tokens)

    def _schedule(self, call: _Call) -> _Launched | None:
        """The next step, scheduled and launched; None when nothing can run until a turn outcome is known."""
        t0 = time.perf_counter()
        batch = call.sched.schedule()
        if batch is None:
            return None
        call.host_s += time.perf_counter() - t0
        return batch, self.runner.launch(batch, call.gen, call.params)

    def _launch_ahead(self, call: _Call, batch: ScheduledBatch, handle: StepHandle) -> _Launched | None:
        """Async scheduling: the decode step after `batch`, scheduled and launched before `batch` is read (its input
        tokens gathered on the device from `batch`'s samples); None when off or when the scheduler declines."""
        t0 = time.perf_counter()
        # with a turn outcome known, a regular schedule comes next: it re-admits that sequence at once
        nxt = (call.sched.schedule_lookahead(batch) if self.config.async_scheduling and not call.outcome_waiting()
               else None)
        call.host_s += time.perf_counter() - t0
        if nxt is None:
            return None
        return nxt, self.runner.launch(nxt, call.gen, call.params, TokenFeed(handle.tokens, nxt.feed_rows))

    def _postprocess(self, call: _Call, batch: ScheduledBatch, tokens: list, logprobs: list) -> None:
        """The step's samples appended (sequences finish, or pause at a turn end, in the scheduler), then the
        paused ones handed to the agent (`_end_turns`)."""
        t0 = time.perf_counter()
        call.sched.postprocess(batch, tokens, logprobs)
        if call.agent is not None:
            self._end_turns(call)
        call.host_s += time.perf_counter() - t0

    # ------------------------------------------------------------------ multi-turn
    def _end_turns(self, call: _Call) -> None:
        """Hand the sequences paused at a turn end to the agent (its tools run on its threads while decoding goes
        on; under TP on the group's rank 0 only), then resume or finish those whose outcome is known."""
        for seq in call.sched.take_paused():
            call.pending[seq.call_key] = seq
            if call.sync.leads:
                future = call.agent.on_turn_end(seq, self._turn_budget(seq))
                future.add_done_callback(lambda f, seq=seq: call.ready.put((seq.call_key, f)))
        self._resume_ready(call, block=False)

    @staticmethod
    def _resume_ready(call: _Call, block: bool) -> None:
        """Resume or finish the paused sequences whose turn outcome is known (waiting for one if `block`); under TP
        the outcomes the group's rank 0 knows now, broadcast, so every rank applies the same ones at the same step."""
        if not call.pending:
            return
        for key, outcome in call.sync.share(lambda: call.known_outcomes(block)):
            seq = call.pending.pop(key)
            for token_ids, tag in outcome.forks:   # before the parent moves on: a branch starts from this turn end
                call.branch(seq, token_ids, tag)
            if outcome.token_ids is not None:
                call.sched.resume(seq, outcome.token_ids)
            else:
                call.sched.finish_paused(seq, outcome.finish_reason)

    def _turn_budget(self, seq: Sequence) -> int:
        """Tokens that may be appended to a paused sequence so that one more can still be sampled."""
        return min(seq.params.max_tokens - seq.num_completion_tokens, self.config.max_model_len - len(seq)) - 1

    # ------------------------------------------------------------------ results
    def _outputs(self, call: _Call) -> list[RequestOutput]:
        """A finished call's counters folded into `stats`; each prompt's, then each continuation's, output."""
        self._record_stats(call)
        experts = self._routed_experts(call, [s for g in call.groups for s in g])
        turn_stats = self._turn_stats(call)
        return [RequestOutput(rid, list(call.prompts[rid]),
                              [self._completion(s, turn_stats, experts.get(s.seq_id)) for s in group])
                for rid, group in enumerate(call.groups)]

    def _record_stats(self, call: _Call) -> None:
        """Fold a finished call's scheduler, runner and clock counters into `stats`."""
        self.stats.update(call.tail.stats())
        self.stats["schedule_s"] += call.host_s
        self.stats["generated_tokens"] += sum(s.num_completion_tokens - s.num_carried_tokens
                                              for group in call.groups for s in group)
        self.stats["cuda_graph_capture_s"] = self.runner.last_capture_s  # graphs are captured on first use
        self.stats.update(self.runner.counters)
        for key, value in call.sched.stats.items():
            self.stats[key] = max(self.stats[key], value) if key in PEAK_STATS else self.stats[key] + value
        st = self.stats
        if self.config.speculative.enable:  # 0 where nothing was drafted
            st["spec_acceptance_rate"] = st["spec_accepted_tokens"] / max(1, st["spec_draft_tokens"])
            st["spec_mean_acceptance_length"] = (st["spec_accepted_tokens"] / st["spec_drafted_seqs"] + 1
                                                 if st["spec_drafted_seqs"] else 0.0)
            st["spec_tokens_per_verify_step"] = st["spec_emitted_tokens"] / max(1, st["spec_verify_steps"])

    def _turn_stats(self, call: _Call) -> dict | None:
        """Each trajectory's counts from the agent (on the TP group's rank 0, shared), by sequence key; a trajectory
        the engine ended at its response budget is marked cut by `max_tokens` or `max_model_len`."""
        if call.agent is None:
            return None
        seqs = [s for g in call.groups for s in g]

        def collect():
            end_call = getattr(call.agent, "end_call", None)   # optional: agents that wait on turns (agent loops)
            if end_call is not None:
                end_call(seqs)
            return {s.call_key: call.agent.trajectory_stats(s) for s in seqs}
        stats = call.sync.share(collect)
        for s in seqs:   # ended by the engine mid-turn: which limit it met
            if s.finish_reason == "length" and not stats[s.call_key].get("cut"):
                stats[s.call_key]["cut"] = "max_model_len" if len(s) >= self.config.max_model_len else "max_tokens"
        return stats

    def _routed_experts(self, call: _Call, seqs: list[Sequence]) -> dict:
        """seq_id -> [len(seq), MoE layers, k] on the host for `seqs` (one copy for all of them); the last row, a
        token never run through the model, holds the 'not recorded' id."""
        ids = [s.seq_id for s in seqs if s.seq_id in call.experts]
        if not ids:
            return {}
        parts = [call.experts[i] for i in ids]
        host = torch.cat([F.pad(p, (0, 0, 0, 0, 0, 1), value=not_routed(self.runner.moe.num_experts))
                          for p in parts]).cpu()
        return dict(zip(ids, host.split([p.shape[0] + 1 for p in parts])))

    @staticmethod
    def _completion(seq: Sequence, turn_stats: dict | None, routed_experts=None) -> CompletionOutput:
        if turn_stats is None:
            return CompletionOutput(seq.sample_index, seq.completion_token_ids, seq.logprobs, seq.finish_reason,
                                    routed_experts=routed_experts)
        return CompletionOutput(seq.sample_index, seq.completion_token_ids, seq.logprobs, seq.finish_reason,
                                response_mask=seq.completion_mask(), turn_stats=turn_stats[seq.call_key],
                                routed_experts=routed_experts)


@dataclass
class _Call:
    """One generate call: its scheduler, sampling, sequences and clocks, and the turns its agent has in flight."""
    sched: Scheduler
    params: SamplingParams
    gen: torch.Generator
    groups: list[list[Sequence]]        # per prompt, its n samples (and the branches forked from them)
    tail: _TailClock
    agent: object = None
    sync: TurnSync | None = None        # multi-turn: where turn outcomes are decided (the TP group's rank 0)
    ready: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # (key, Future) of the paused sequences
                                                                        # whose outcome is known (tool threads put)
    pending: dict = field(default_factory=dict)     # key -> paused sequence waiting on its turn outcome
    host_s: float = 0.0                 # host time in scheduling and postprocessing (stats["schedule_s"])
    experts: dict = field(default_factory=dict)     # seq_id -> its routing record on the device, as it finished
    prompts: list = field(default_factory=list)     # per group, its prompt's token ids
    ahead: _Launched | None = None      # async scheduling: a step launched by the step before, not read yet
    done_groups: list = field(default_factory=list)  # indices of groups finished since the last report
    on_group_done: object = None        # generate's on_group_done, or None

    def __post_init__(self):
        self.num_seqs = 0
        for seq in (s for g in self.groups for s in g):
            self._keep(seq)

    def done(self) -> bool:
        """Every sequence finished, and no step launched ahead left to read."""
        return self.ahead is None and self.sched.is_finished()

    def take_ahead(self) -> _Launched | None:
        """The step launched ahead, if any, taken to be read now."""
        ahead, self.ahead = self.ahead, None
        return ahead

    def _keep(self, seq: Sequence) -> None:
        seq.call_key, self.num_seqs = self.num_seqs, self.num_seqs + 1

    def branch(self, parent: Sequence, token_ids: list[int], tag) -> None:
        """A new sample of parent's prompt continuing parent's history after `token_ids` (an agent loop's fork)."""
        group = self.groups[parent.request_id]
        child = parent.branch(sample_index=len(group))
        child.agent_state = tag
        self._keep(child)
        group.append(child)
        self.sched.branch(parent, child, token_ids)

    def outcome_waiting(self) -> bool:
        """A turn outcome known and not applied yet. Under TP the ranks learn outcomes only when they are shared,
        so there this is False: the ranks must decide alike whether to schedule ahead."""
        return self.sync is not None and self.sync.group is None and not self.ready.empty()

    def known_outcomes(self, block: bool) -> list:
        """(key, TurnOutcome) of each turn whose outcome is known (waiting for the first if `block`)."""
        out = []
        while True:
            try:
                key, future = self.ready.get(block=block and not out)
            except queue.Empty:
                return out
            out.append((key, future.result()))  # the agent's own failures (not a tool's) propagate


class _TailClock:
    """Wall time of a generate call's steps by how many sequences were running, and the decode floor."""

    def __init__(self, num_seqs: int, step_floor_s):
        self.cut = TAIL_FRACTION * num_seqs
        self.step_floor_s = step_floor_s      # (total context of a step's sequences) -> seconds, or None
        self.start = time.perf_counter()
        self.decode_s = self.tail_s = 0.0
        self.steps = self.seq_steps = 0
        self.floor_s = 0.0 if step_floor_s is not None else None

    def step(self, batch, t0: float, kv_tokens: int) -> None:
        """`kv_tokens`: the context tokens whose K/V a decode step must read (the runner's StepHandle.kv_tokens)."""
        if batch.is_prefill:
            return
        dt = time.perf_counter() - t0
        running = len(batch.seqs)
        self.decode_s += dt
        self.steps += 1
        self.seq_steps += running
        if running < self.cut:
            self.tail_s += dt
        if self.floor_s is not None:
            self.floor_s += self.step_floor_s(kv_tokens)

    def stats(self) -> dict:
        wall = time.perf_counter() - self.start
        out = {"decode_s": self.decode_s, "tail_time_frac": self.tail_s / wall if wall > 0 else 0.0,
               "running_seqs_mean": self.seq_steps / self.steps if self.steps else 0.0}
        if self.floor_s is not None:
            out["decode_floor_s"] = self.floor_s
        return out
