"""Sequence: one sample being generated (pure Python, no tensors).

Choices: a sequence holds prompt + generated ids in one list and a block table of physical KV
blocks; `num_cached_tokens` counts the leading tokens whose K/V are already in the cache (0 for a
fresh prefill, the shared full prompt blocks for a re-admitted fork, len-1 while decoding).
`group_id` ties the n samples of one prompt together for prefix sharing. `pending`: the last token is
PLACEHOLDER, standing for the sample of a step still in flight (async scheduling, scheduler.py).
Multi-turn: a sequence is PAUSED (its KV blocks kept) while the tools of its ended turn run; `inject` appends the
tokens that did not come from the model (tool messages and the template around them) with log-prob 0, recording
their span in `injected`, and the next turn starts at `turn_start`. `agent_state` belongs to the turn agent. `branch`
copies a paused sequence's history into a new sample of the same prompt (an agent loop's fork).
Partial rollouts: a sequence may start with tokens sampled in an earlier call (`carried`: completion tokens and
their log-probs, prefilled with the prompt); `budget_end` is the length at which this call's `token_budget` stops it.
"""

from __future__ import annotations

import enum
import itertools

from hybridrl.rollout.sampling_params import SamplingParams

_ids = itertools.count()
PLACEHOLDER = -1


class SeqStatus(enum.Enum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2
    PAUSED = 3  # a turn ended; its tools run while the KV blocks are kept


class Sequence:
    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, request_id: int = 0,
                 sample_index: int = 0, group_id: int | None = None,
                 carried: tuple[list[int], list[float]] = ((), ())):
        self.seq_id = next(_ids)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.token_ids.extend(carried[0])
        self.num_carried_tokens = len(carried[0])  # sampled in earlier calls
        self.params = params
        self.request_id = request_id
        self.sample_index = sample_index
        self.group_id = self.seq_id if group_id is None else group_id
        self.block_table: list[int] = []
        self.num_cached_tokens = 0
        self.status = SeqStatus.WAITING
        self.logprobs: list[float] = list(carried[1])
        self.budget_end = None if params.token_budget is None else len(self.token_ids) + params.token_budget
        self.finish_reason: str | None = None
        self.pending = False
        self.turn_start = self.num_prompt_tokens  # where the current assistant turn's tokens begin
        self.injected: list[tuple[int, int]] = []  # completion-relative [start, end) spans not sampled by the model
        self.agent_state = None
        self.call_key: int | None = None  # its index in its generate call, the same on every TP rank (seq_id is not)

    def out_of_budget(self, length: int) -> bool:
        """Whether this call's token budget stops the sequence once it holds `length` tokens."""
        return self.budget_end is not None and length >= self.budget_end

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def num_blocks_for(self, num_tokens: int, block_size: int) -> int:
        return -(-num_tokens // block_size)

    def append(self, token_id: int, logprob: float) -> None:
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)

    def inject(self, token_ids: list[int]) -> None:
        """Append non-model tokens (log-prob 0) and start the next assistant turn after them."""
        start = self.num_completion_tokens
        self.token_ids.extend(token_ids)
        self.logprobs.extend([0.0] * len(token_ids))
        self.injected.append((start, start + len(token_ids)))
        self.turn_start = len(self.token_ids)

    def branch(self, sample_index: int) -> Sequence:
        """A copy of this (paused) sequence's history as a new sample of its prompt; blocks are the scheduler's."""
        child = Sequence(self.token_ids[:self.num_prompt_tokens], self.params, self.request_id, sample_index,
                         self.group_id)
        child.token_ids = list(self.token_ids)
        child.logprobs = list(self.logprobs)
        child.injected = list(self.injected)
        child.turn_start = self.turn_start
        return child

    def completion_mask(self) -> list[int]:
        """1 for each completion token the model sampled, 0 for injected ones."""
        mask = [1] * self.num_completion_tokens
        for start, end in self.injected:
            mask[start:end] = [0] * (end - start)
        return mask

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, len={len(self)}, cached={self.num_cached_tokens}, "
                f"blocks={self.block_table}, {self.status.name})")
