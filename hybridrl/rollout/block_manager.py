"""BlockManager: ref-counted physical KV blocks (pure Python).

Choices:
- A block is shared when its ref count is > 1: the n samples of a prompt fork from the one sequence
  that prefilled it, so the prompt's K/V is computed and stored once.
- Copy-on-write happens only where a sequence would write into a shared block: the last, partial
  prompt block, at the sample's first decode step. `append_slot` then returns (src, dst) for the
  runner to copy on the device before that step. Full prompt blocks are never written again.
- A multi-turn continuation (`extend`) keeps the sequence's blocks and adds what its appended tokens need; the
  block holding the first recomputed position is copied first when it is still shared (a turn that ended on its
  first sampled token never decoded, so its partial prompt block may still be its siblings').
- Speculative decoding: `grow` adds blocks for a sequence's draft positions, `trim` gives back those past what the
  accepted tokens need; draft positions never share a block (the one holding len-1 was copied by append_slot).
- No content-hash prefix cache across requests: the hybrid engine resets the cache every step
  (weights change), so only within-request sharing pays.
"""

from __future__ import annotations

from collections import deque

from hybridrl.rollout.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_kv_blocks={num_blocks} and block_size={block_size} must both be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free_blocks)

    def _take(self) -> int:
        block = self.free_blocks.popleft()
        assert self.ref_counts[block] == 0, f"block {block} on the free list has refs"
        self.ref_counts[block] = 1
        return block

    def _incref(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"incref of free block {block}"
        self.ref_counts[block] += 1

    def _decref(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"decref of free block {block}"
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks.append(block)

    def blocks_needed(self, seq: Sequence, shared_prefix: list[int] = ()) -> int:
        return seq.num_blocks_for(len(seq), self.block_size) - len(shared_prefix)

    def allocate(self, seq: Sequence, shared_prefix: list[int] = ()) -> None:
        """Give `seq` blocks for all its tokens; `shared_prefix` (full blocks of a sibling) is referenced."""
        assert not seq.block_table, f"{seq} already has blocks"
        for block in shared_prefix:
            self._incref(block)
        seq.block_table = list(shared_prefix) + [self._take() for _ in range(self.blocks_needed(seq, shared_prefix))]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` references all of `parent`'s blocks (same prompt, nothing generated yet)."""
        assert not child.block_table
        for block in parent.block_table:
            self._incref(block)
        child.block_table = list(parent.block_table)

    def free(self, seq: Sequence) -> None:
        for block in reversed(seq.block_table):
            self._decref(block)
        seq.block_table = []

    def _needs_copy(self, seq: Sequence, index: int) -> bool:
        return index < len(seq.block_table) and self.ref_counts[seq.block_table[index]] > 1

    def blocks_to_extend(self, seq: Sequence) -> int:
        """Blocks `extend` takes: new ones for positions up to len-1, plus one copy of a shared block."""
        first = seq.num_cached_tokens // self.block_size
        return (seq.num_blocks_for(len(seq), self.block_size) - len(seq.block_table)
                + self._needs_copy(seq, first))

    def extend(self, seq: Sequence) -> list[tuple[int, int]]:
        """Make positions num_cached_tokens..len-1 of a sequence that keeps its blocks writable; returns the
        (src, dst) copies the runner makes before the step."""
        copies = []
        first = seq.num_cached_tokens // self.block_size
        if self._needs_copy(seq, first):
            src, dst = seq.block_table[first], self._take()
            self._decref(src)
            # a new list, not an in-place edit: the runner re-copies a block-table row when the list object changes
            seq.block_table = seq.block_table[:first] + [dst] + seq.block_table[first + 1:]
            copies.append((src, dst))
        while len(seq.block_table) < seq.num_blocks_for(len(seq), self.block_size):
            seq.block_table.append(self._take())
        return copies

    def needs_free_block(self, seq: Sequence) -> bool:
        """Whether writing K/V of the last token (position len-1) needs a new block (fresh or copy)."""
        index = (len(seq.token_ids) - 1) // self.block_size
        return index == len(seq.block_table) or self.ref_counts[seq.block_table[index]] > 1

    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        """Make position len-1 writable: a fresh block where the position starts one, a copy where its block is
        shared; returns (src, dst) when a block was copied."""
        table = seq.block_table
        index = (len(seq.token_ids) - 1) // self.block_size
        if index == len(table):
            table.append(self._take())
            return None
        src = table[index]
        if self.ref_counts[src] == 1:
            return None
        dst = self._take()
        self._decref(src)
        table[index] = dst
        return src, dst

    def append_slots(self, seqs) -> list[tuple[int, int]]:
        """append_slot for each of `seqs` (a decode step's rows); the copies made."""
        return [copy for copy in map(self.append_slot, seqs) if copy is not None]

    def grow(self, seq: Sequence, extra: int) -> int:
        """Room for `extra` positions after len-1 (which append_slot made writable): fresh blocks as needed, as many
        as are free. Returns how many of those positions have room (speculative drafts; never preempts)."""
        have = len(seq.block_table) * self.block_size
        while have < len(seq) + extra and self.free_blocks:
            seq.block_table.append(self._take())
            have += self.block_size
        return min(extra, have - len(seq))

    def trim(self, seq: Sequence) -> None:
        """Free the blocks past those holding positions 0..len-2 (the K/V a decode step reads; blocks taken for
        rejected draft tokens). A new list, so that the runner re-copies the block-table row."""
        keep = seq.num_blocks_for(len(seq) - 1, self.block_size)
        for block in reversed(seq.block_table[keep:]):
            self._decref(block)
        seq.block_table = seq.block_table[:keep]

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
