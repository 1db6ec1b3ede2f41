"""N-gram drafts for speculative decoding: the tokens that followed the sequence's latest suffix elsewhere in its
own prompt and response or in its GRPO siblings' responses.

Choices:
- One index per group (the n samples of a prompt): n-gram (as a tuple, min_match..max_match tokens) -> where it
  last ended, as (sequence, position after it). The prompt is indexed once, from the group's first sequence (its
  n-grams followed by prompt tokens); each sequence adds the n-grams that end from its last prompt token on. A
  draft is read from the source sequence's token list at propose time, so it follows the source as it grows.
- Lazy and incremental: a group's index is brought up to date only when one of its sequences asks for a draft,
  adding just the n-grams that gained a follower since the last time. Speculation runs in the tail, so groups
  whose sequences finished before it cost nothing on the host during the full-batch steps; a group catching up
  pays once for what it missed.
- An n-gram enters the index only once the token after it is known (never the sequence's own last suffix, which
  has no continuation yet) and never over a placeholder (a token of a step still in flight, scheduler.py).
- Lookup: the longest suffix first; among equal-length matches the one indexed last (the latest occurrence in a
  sequence; across siblings, the one whose tokens were indexed last). A draft stops at a placeholder. A match in
  the sequence's own tokens reads on past its end into the draft itself (an overlapping copy), so a repeating
  pattern — the latest occurrence of its suffix is one period back — is drafted k tokens ahead, not one period.
Drafts only choose what is verified: rollout/spec_verify.py accepts them so that the sampled distribution is the
target's whatever they are.
"""

from __future__ import annotations

from hybridrl.rollout.config import SpeculativeConfig
from hybridrl.rollout.sequence import PLACEHOLDER, Sequence


class _GroupIndex:
    def __init__(self, members: list[Sequence]):
        self.members = members
        self.table: dict[tuple[int, ...], tuple[Sequence, int]] = {}
        # per member: the first n-gram end position not indexed yet (the prompt's are the first member's)
        self.next_end = {id(s): s.num_prompt_tokens - 1 for s in members}
        self.next_end[id(members[0])] = 0

    def catch_up(self, min_n: int, max_n: int) -> None:
        table = self.table
        for seq in self.members:
            toks = seq.token_ids
            # ends with a known follower: positions < len - 1, and not before a placeholder
            stop = len(toks) - 1 - (toks[-1] == PLACEHOLDER)
            start = self.next_end[id(seq)]
            for end in range(start, stop):
                follow = end + 1
                for n in range(min_n, min(max_n, follow) + 1):
                    table[tuple(toks[follow - n:follow])] = (seq, follow)
            self.next_end[id(seq)] = max(start, stop)


class NgramDrafter:
    def __init__(self, groups: list[list[Sequence]], config: SpeculativeConfig):
        self.min_n, self.max_n = config.min_match, config.max_match
        self._index = {g[0].group_id: _GroupIndex(g) for g in groups}

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to `k` tokens that followed the longest matching suffix of `seq`'s tokens (none if no match)."""
        toks = seq.token_ids
        if k <= 0 or len(toks) < self.min_n or toks[-1] == PLACEHOLDER:
            return []
        index = self._index[seq.group_id]
        index.catch_up(self.min_n, self.max_n)
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            hit = index.table.get(tuple(toks[-n:]))
            if hit is not None:
                src, at = hit
                draft = src.token_ids[at:at + k]
                if PLACEHOLDER in draft:
                    return draft[:draft.index(PLACEHOLDER)]
                if src is seq:  # a match in its own tokens runs on into the draft itself (a repeating pattern)
                    while len(draft) < k:
                        draft.append(draft[len(draft) - (len(toks) - at)])
                return draft
        return []
