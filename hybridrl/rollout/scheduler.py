"""Scheduler: continuous batching over prefill and decode steps (pure Python).

Choices (after nano-vllm, minus its asserts for user errors):
- A step is either a prefill (new or re-admitted sequences, up to `max_num_batched_tokens` computed
  tokens and `max_num_seqs` running sequences) or a decode (one token for every running sequence).
  Prefill goes first whenever something waits and fits, which keeps the decode batch full.
- With `enable_prefix_sharing` the n samples of a prompt are admitted together: the first prefills
  the prompt, the others fork its blocks (ref-counted); its logits row is sampled n times. Without
  it each sample is its own waiting item and prefills the prompt itself (the unshared baseline).
- Out of blocks during decode -> preempt by recompute the most recently admitted sequence (free its
  blocks, put it first in the queue), counted in `stats['num_preemptions']`. A re-admitted sample
  whose siblings still run references their full prompt blocks again and recomputes only the rest.
- Async scheduling (`schedule_lookahead`): the decode step after a decode step can be scheduled before
  that step's tokens are known — same sequences, minus those it surely finishes by length, each extended
  by a placeholder the runner fills on the device. Declined (the engine then reads first) when anything
  waits for admission or a new block is not free: admission and preemption decide on real tokens. A
  sequence that ends by eos/stop token in the step still in flight gets one wasted sample in the
  lookahead step; `postprocess` drops it (`num_lookahead_discarded`).
- A sequence that reaches its call's token budget (partial rollouts) ends like a finished one, with
  finish_reason BUDGET; an eos or the length limit in the same token wins (the sample is then complete).
- Multi-turn (`turn_end` given): a sampled token that ends an assistant turn (the predicate decides) pauses the
  sequence instead of finishing it: it leaves `running` with its KV blocks and is reported by `take_paused`. The
  engine later calls `resume` (tokens appended; the sequence goes to the FRONT of the queue, since it holds blocks,
  and is prefilled from its last sampled token on — the history's K/V is reused) or `finish_paused`. A
  continuation that cannot get its blocks while nothing runs gives them up (preempted: recomputed later from
  scratch); `schedule` returns None when only paused sequences could make progress (the engine then waits for
  a tool). Samples of a lookahead step for a sequence that paused meanwhile are dropped like those of a
  finished one. `branch` queues a copy of a paused sequence that references its blocks (an agent loop's fork).
- Speculative decoding (a `drafter` given, rollout/ngram_draft.py): a decode step with at most
  `speculative.max_running_seqs` sequences asks the drafter for each one's draft, capped so that no token lands past
  max_tokens or max_model_len and the step's rows (one per sequence plus one per draft token) stay within
  `max_decode_rows` (EngineConfig), and reserves blocks for the draft positions (fewer drafts when the cache runs short: drafts never
  preempt). With no draft at all the step is a plain decode. `postprocess` appends each sequence's emitted tokens
  one by one with the stop/length rules of plain decoding (tokens after an end are dropped, counted in
  `spec_discarded_tokens`) and trims the blocks of rejected positions. The lookahead is declined in that regime,
  so verify steps are scheduled on real tokens — except after DRAFTLESS_STEPS consecutive steps in which the drafter
  found nothing (text that repeats nothing, e.g. a random-weight model): then the lookahead's overlap is kept and
  only one step in PROBE_EVERY is scheduled on real tokens to ask the drafter again (`spec_probe_steps`). Both
  kinds of step are exact, so this changes the speed only, never the tokens.
- Stats: `kv_blocks_peak` (physical blocks in use) and `kv_blocks_peak_unshared` (sum of the running
  sequences' block tables = what the same schedule needs without sharing).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hybridrl.rollout.block_manager import BlockManager
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.sampling_params import BUDGET
from hybridrl.rollout.sequence import PLACEHOLDER, SeqStatus, Sequence

# Speculation with nothing to draft costs the lookahead's overlap on every step; after this many draftless steps in a
# row the lookahead runs again, and one step in PROBE_EVERY asks the drafter whether drafts have appeared.
DRAFTLESS_STEPS = 8
PROBE_EVERY = 16

# the stats that are peaks (the largest over a call's steps), not amounts that add up
PEAK_STATS = ("kv_blocks_peak", "kv_blocks_peak_unshared")
# speculative decoding's counters (engine.stats adds the rates derived from them)
SPEC_COUNTERS = ("spec_verify_steps", "spec_draft_tokens", "spec_drafted_seqs", "spec_accepted_tokens",
                 "spec_emitted_tokens", "spec_discarded_tokens", "spec_probe_steps")


@dataclass
class ScheduledBatch:
    is_prefill: bool
    seqs: list[Sequence]  # one model-input row each
    sample_groups: list[list[Sequence]]  # per row: the sequences that take a sample from its logits
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    feed_rows: list[int] | None = None  # lookahead: row i's input token is sample feed_rows[i] of the step before
    drafts: list[list[int]] | None = None  # a verify step: per sequence, the draft tokens checked after its last


class Scheduler:
    def __init__(self, block_manager: BlockManager, config: EngineConfig, turn_end=None, drafter=None,
                 on_finish=None):
        """`config`: resolved (EngineConfig.for_model), so max_model_len and eos_token_ids are set; `drafter`:
        speculative decoding's draft proposer (None: off); `on_finish(seq)`: called for each finished sequence
        while it still holds its KV blocks."""
        self.bm = block_manager
        self.on_finish = on_finish or (lambda seq: None)
        self.config = config
        self.eos_token_ids = set(config.eos_token_ids)  # a set: postprocess tests every sampled token
        self.waiting: deque[list[Sequence]] = deque()
        self.running: deque[Sequence] = deque()
        self.turn_end = turn_end  # (seq) -> bool: its last sampled token ends an assistant turn
        self.paused: set[Sequence] = set()
        self._newly_paused: list[Sequence] = []
        self.drafter = drafter
        self._draftless_steps = 0       # consecutive speculating steps in which the drafter found nothing
        self._lookahead_since_probe = 0
        self.stats = {"num_preemptions": 0, "num_cow_copies": 0, "num_prefill_steps": 0, "num_decode_steps": 0,
                      "prefill_tokens_computed": 0, "kv_blocks_peak": 0, "kv_blocks_peak_unshared": 0,
                      "num_lookahead_steps": 0, "num_lookahead_discarded": 0, **dict.fromkeys(SPEC_COUNTERS, 0)}

    def add_group(self, seqs: list[Sequence]) -> None:
        if self.config.enable_prefix_sharing:
            self.waiting.append(list(seqs))
        else:
            self.waiting.extend([s] for s in seqs)

    def is_finished(self) -> bool:
        return not self.waiting and not self.running and not self.paused

    # ------------------------------------------------------------------ multi-turn
    def take_paused(self) -> list[Sequence]:
        """Sequences paused at a turn end since the last call."""
        out, self._newly_paused = self._newly_paused, []
        return out

    def resume(self, seq: Sequence, token_ids: list[int]) -> None:
        """Append `token_ids` (not sampled) and queue the sequence to continue on its cached K/V."""
        self.paused.remove(seq)
        last = len(seq) - 1  # the turn's last sampled token: its K/V is written by the continuation's prefill
        seq.inject(token_ids)
        seq.num_cached_tokens = last
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft([seq])

    def branch(self, parent: Sequence, child: Sequence, token_ids: list[int]) -> None:
        """Queue `child` (a copy of paused `parent`'s history) to continue after `token_ids` on the parent's K/V:
        it references the parent's blocks; the first write into a shared one copies it (BlockManager.extend)."""
        self.bm.fork(parent, child)
        self.paused.add(child)
        self.resume(child, token_ids)

    def finish_paused(self, seq: Sequence, reason: str) -> None:
        self.paused.remove(seq)
        seq.finish_reason = reason
        seq.status = SeqStatus.FINISHED
        self.on_finish(seq)
        self.bm.free(seq)

    # ------------------------------------------------------------------ scheduling
    def _shared_prefix(self, seq: Sequence) -> list[int]:
        if not self.config.enable_prefix_sharing or seq.num_completion_tokens == 0:
            return []
        full = seq.num_prompt_tokens // self.bm.block_size
        for other in self.running:
            if other.group_id == seq.group_id and len(other.block_table) >= full:
                return other.block_table[:full]
        return []

    def _admit_continuation(self, seq: Sequence, tokens: int, copies: list) -> bool:
        if tokens + len(seq) - seq.num_cached_tokens > self.config.max_num_batched_tokens:
            return False
        if not self.bm.can_allocate(self.bm.blocks_to_extend(seq)):
            return False
        copies += self.bm.extend(seq)
        return True

    def _schedule_prefill(self) -> ScheduledBatch | None:
        rows, groups, tokens, copies = [], [], 0, []
        while self.waiting:
            group = self.waiting[0]
            leader = group[0]
            if len(self.running) + len(group) > self.config.max_num_seqs:
                break
            if leader.block_table:  # a multi-turn continuation: keeps its blocks, prefills only the new tokens
                if not self._admit_continuation(leader, tokens, copies):
                    break
                self.waiting.popleft()
                leader.status = SeqStatus.RUNNING
                self.running.append(leader)
                rows.append(leader)
                groups.append(group)
                tokens += len(leader) - leader.num_cached_tokens
                continue
            prefix = self._shared_prefix(leader)
            cached = len(prefix) * self.bm.block_size
            if tokens + len(leader) - cached > self.config.max_num_batched_tokens:
                break
            if not self.bm.can_allocate(self.bm.blocks_needed(leader, prefix)):
                break
            self.waiting.popleft()
            self.bm.allocate(leader, prefix)
            leader.num_cached_tokens = cached
            for child in group[1:]:
                self.bm.fork(leader, child)
            for seq in group:
                seq.status = SeqStatus.RUNNING
                self.running.append(seq)
            rows.append(leader)
            groups.append(group)
            tokens += len(leader) - cached
        if not rows:
            return None
        self.stats["num_prefill_steps"] += 1
        self.stats["prefill_tokens_computed"] += tokens
        self.stats["num_cow_copies"] += len(copies)
        return ScheduledBatch(True, rows, groups, copies)

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free(seq)
        seq.status = SeqStatus.WAITING
        seq.num_cached_tokens = 0
        self.waiting.appendleft([seq])
        self.stats["num_preemptions"] += 1

    def _schedule_decode(self) -> ScheduledBatch:
        scheduled, copies = [], []
        while self.running and len(scheduled) < self.config.max_num_seqs:
            seq = self.running.popleft()
            while self.bm.needs_free_block(seq) and not self.bm.can_allocate(1):
                if self.running:
                    self._preempt(self.running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                copy = self.bm.append_slot(seq)
                if copy is not None:
                    copies.append(copy)
                scheduled.append(seq)
        self.running.extendleft(reversed(scheduled))
        self.stats["num_decode_steps"] += bool(scheduled)
        self.stats["num_cow_copies"] += len(copies)
        drafts = self._drafts(scheduled) if self._speculating() else None
        return ScheduledBatch(False, scheduled, [[s] for s in scheduled], copies, drafts=drafts)

    def _speculating(self) -> bool:
        return self.drafter is not None and len(self.running) <= self.config.speculative.max_running_seqs

    def _wants_drafts(self) -> bool:
        """Whether the next decode step must be scheduled on real tokens so the drafter can propose for it."""
        if not self._speculating():
            return False
        if self._draftless_steps < DRAFTLESS_STEPS:
            return True
        self._lookahead_since_probe += 1
        if self._lookahead_since_probe < PROBE_EVERY:
            return False
        self._lookahead_since_probe = 0
        self.stats["spec_probe_steps"] += 1
        return True

    def _drafts(self, seqs: list[Sequence]) -> list[list[int]] | None:
        """Each sequence's draft (capped by its max_tokens and max_model_len, the step's rows by max_decode_rows, its
        positions by the free blocks); None when no sequence has one."""
        c, rows, drafts = self.config, len(seqs), []
        for seq in seqs:
            k = min(c.speculative.num_draft_tokens, seq.params.max_tokens - seq.num_completion_tokens - 1,
                    c.max_model_len - len(seq) - 1, c.max_decode_rows - rows)
            draft = self.drafter.propose(seq, k) if k > 0 else []
            draft = draft[:self.bm.grow(seq, len(draft))] if draft else draft
            rows += len(draft)
            drafts.append(draft)
        if rows == len(seqs):
            self._draftless_steps += 1
            return None
        self._draftless_steps = 0
        self.stats["spec_verify_steps"] += 1
        self.stats["spec_draft_tokens"] += rows - len(seqs)
        self.stats["spec_drafted_seqs"] += sum(1 for d in drafts if d)
        return drafts

    def schedule(self) -> ScheduledBatch | None:
        """The next step; None when nothing can run until a paused sequence resumes or finishes."""
        batch = self._schedule_prefill() if self.waiting else None
        while batch is None and not self.running and self._free_waiting_blocks():
            batch = self._schedule_prefill()
        if batch is None:
            if not self.running:
                if self.paused:
                    return None
                leader = self.waiting[0][0]
                raise ValueError(
                    f"num_kv_blocks={self.bm.num_blocks} (block_size={self.bm.block_size}) cannot hold one "
                    f"sequence of {len(leader)} tokens (needs {self.bm.blocks_needed(leader)} blocks); raise "
                    "gpu_memory_utilization / num_kv_blocks or lower max_model_len")
            batch = self._schedule_decode()
            if not batch.seqs:  # each running sequence gave its blocks up (paused ones hold the rest): try again
                return self.schedule()
        self._update_peaks()
        return batch

    def _free_waiting_blocks(self) -> bool:
        """With nothing running and nothing admissible: free the blocks of the last queued continuation that holds
        some (it is recomputed when admitted), so that whatever waits ahead of it can run. False if none holds any."""
        for i in range(len(self.waiting) - 1, -1, -1):
            group = self.waiting[i]
            if len(group) == 1 and group[0].block_table:
                del self.waiting[i]
                self._preempt(group[0])
                return True
        return False

    def schedule_lookahead(self, prev: ScheduledBatch) -> ScheduledBatch | None:
        """The decode step after `prev` (launched, not read yet), or None when it must wait for prev's tokens."""
        if prev.is_prefill or self.waiting or self._wants_drafts():
            return None
        keep, rows, new_blocks = [], [], 0
        running, max_len, block_size = SeqStatus.RUNNING, self.config.max_model_len, self.bm.block_size
        for i, seq in enumerate(prev.seqs):   # (the hot loop of a decode step: locals, no per-token calls)
            n = len(seq.token_ids) + 1  # its length once prev's sample is in
            if seq.status is not running or n - seq.num_prompt_tokens >= seq.params.max_tokens or n >= max_len \
                    or (seq.budget_end is not None and seq.out_of_budget(n)):
                continue
            keep.append(seq)
            rows.append(i)
            new_blocks += (n - 1) // block_size == len(seq.block_table)
        if not keep or not self.bm.can_allocate(new_blocks):
            return None
        for seq in keep:
            seq.token_ids.append(PLACEHOLDER)
            seq.pending = True
            seq.num_cached_tokens = len(seq.token_ids) - 1
        if self.bm.append_slots(keep):  # prev was a decode: every shared block was copied already
            raise RuntimeError(f"lookahead step needed copy-on-write: {keep}")
        self.stats["num_decode_steps"] += 1
        self.stats["num_lookahead_steps"] += 1
        self._update_peaks()
        return ScheduledBatch(False, keep, [[s] for s in keep], feed_rows=rows)

    def _update_peaks(self) -> None:
        self.stats["kv_blocks_peak"] = max(self.stats["kv_blocks_peak"], self.bm.num_used)
        unshared = sum(len(s.block_table) for s in self.running) + sum(len(s.block_table) for s in self.paused)
        self.stats["kv_blocks_peak_unshared"] = max(self.stats["kv_blocks_peak_unshared"], unshared)

    # ------------------------------------------------------------------ results
    def postprocess(self, batch: ScheduledBatch, token_ids: list, logprobs: list) -> list[Sequence]:
        """Append the sampled tokens: one per sequence (flattened over sample_groups), or for a verify step a list
        per sequence (its accepted drafts and one more, padded with -1). Returns the finished sequences."""
        if batch.drafts is not None:
            return self._postprocess_verify(batch, token_ids, logprobs)
        finished, ended, discarded = [], False, 0
        flat = [s for group in batch.sample_groups for s in group]
        running, end_if_done = SeqStatus.RUNNING, self._end_if_done
        for seq, tok, lp in zip(flat, token_ids, logprobs, strict=True):
            if seq.status is not running:  # ended or paused while this (lookahead) step was in flight
                discarded += 1
                continue
            if seq.pending:  # a lookahead step already holds this token's place (and its KV slot)
                seq.token_ids[-1] = tok
                seq.pending = False
            else:
                seq.token_ids.append(tok)
                seq.num_cached_tokens = len(seq.token_ids) - 1
            seq.logprobs.append(lp)
            ended |= end_if_done(seq, tok, finished)
        self.stats["num_lookahead_discarded"] += discarded
        if ended:  # one pass instead of a deque.remove (O(running)) per sequence
            self.running = deque(s for s in self.running if s.status is SeqStatus.RUNNING)
        return finished

    def _postprocess_verify(self, batch: ScheduledBatch, token_ids: list[list[int]],
                            logprobs: list[list[float]]) -> list[Sequence]:
        finished, ended = [], False
        for seq, toks, lps, draft in zip(batch.seqs, token_ids, logprobs, batch.drafts, strict=True):
            emitted = toks.index(-1) if -1 in toks else len(toks)
            self.stats["spec_accepted_tokens"] += emitted - 1
            self.stats["spec_emitted_tokens"] += emitted
            for i in range(emitted):
                seq.token_ids.append(toks[i])
                seq.logprobs.append(lps[i])
                if self._end_if_done(seq, toks[i], finished):
                    self.stats["spec_discarded_tokens"] += emitted - 1 - i
                    ended = True
                    break
            seq.num_cached_tokens = len(seq.token_ids) - 1
            if seq.status is SeqStatus.RUNNING and draft:
                self.bm.trim(seq)
        if ended:
            self.running = deque(s for s in self.running if s.status is SeqStatus.RUNNING)
        return finished

    def _end_if_done(self, seq: Sequence, tok: int, finished: list[Sequence]) -> bool:
        """After `tok` was appended: pause the sequence at a turn end, or finish it on eos/stop or at max_tokens /
        max_model_len (its blocks freed, appended to `finished`). True when it left `running`."""
        n, p = len(seq.token_ids), seq.params
        if self.turn_end is not None and self.turn_end(seq):
            seq.status = SeqStatus.PAUSED
            self.paused.add(seq)
            self._newly_paused.append(seq)
            return True
        if (not p.ignore_eos and tok in self.eos_token_ids) or (p.stop_token_ids and tok in p.stop_token_ids):
            seq.finish_reason = "stop"
        elif n - seq.num_prompt_tokens >= p.max_tokens or n >= self.config.max_model_len:
            seq.finish_reason = "length"
        elif seq.budget_end is not None and seq.out_of_budget(n):  # unfinished: the caller may continue it
            seq.finish_reason = BUDGET
        if seq.finish_reason is None:
            return False
        seq.status = SeqStatus.FINISHED
        self.on_finish(seq)
        self.bm.free(seq)
        finished.append(seq)
        return True
