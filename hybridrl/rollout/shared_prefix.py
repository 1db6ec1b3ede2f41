"""Cascade attention for decode: which rows of a decode step share their leading K/V blocks, and whether reading
that shared prefix once per group (rollout/triton_decode.py) pays for its extra kernels.

Choices:
- Sharing is read off the block tables, not assumed from `group_id`: consecutive rows whose tables begin with the
  same physical blocks (the n samples forked from one prefill; a carried or re-prefilled sample shares nothing).
  The shared prefix is the run of leading blocks equal in every row of the group, and only full blocks before each
  row's last token (the block the step writes is never in it), so it holds the same K/V for every member.
- Groups are runs of consecutive rows (the scheduler keeps a prompt's samples together); a run longer than
  `prefix_members` rows is cut into near-equal parts, each reading the prefix once; a part of one row is left to
  the per-row kernel, so a step has at most rows // 2 groups (the fixed grid of a CUDA-graph bucket).
- Worth it only where the per-row kernel's repeated reads of a prefix go to HBM: the rows of a group run at about
  the same time, so while every group's prefix fits in L2 their repeats are cache hits and the per-row kernel is
  as fast as the cascade (whose merge costs a few microseconds a layer). Measured on an H100 (52 MB of L2,
  benchmarks/results/cascade_decode/cascade_decode.json, one layer): 256-token prompts x 32 groups (8-17 MB a
  layer) 0.64-0.94x with the cascade, prefixes of 34 MB a layer 0.88-1.14x, of 67-268 MB (2,048-4,096-token
  prompts) 0.99-1.53x. `use_cascade` asks for the prefixes' K/V to reach MIN_L2_FRACTION of L2.
- The same groups give a step's bandwidth floor the K/V its rows share (`repeated_tokens`, counted once).
- Pure Python over lists: the runner recomputes the groups only when a row's block-table list is replaced or a
  block is copied on write; blocks appended as sequences grow do not move a prefix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

MIN_PREFIX_TOKENS = 64        # a shorter shared prefix is left to the per-row kernel
MIN_L2_FRACTION = 1.0        # the prefixes' K/V a layer must reach this share of L2 (see use_cascade)


def cascade_switched_off() -> bool:
    """`HYBRIDRL_CASCADE=0`: the engine never runs cascade decode (A/B runs, debugging)."""
    return os.environ.get("HYBRIDRL_CASCADE", "1") == "0"


def prefix_members(group: int) -> int:
    """Rows of one prefix group a program attends together: their `group` query heads each (q heads per kv head)
    stack into one tl.dot tile of at most 64 rows."""
    return max(1, min(16, 64 // group))


@dataclass
class SharedPrefix:
    """A decode step's prefix groups as the kernels read them (device tensors, sizes fixed per CUDA-graph bucket):
    `lens_B` each row's shared-prefix tokens (0: none), `first_G` / `count_G` each group's first row and its number
    of consecutive rows (count 0: an unused slot)."""
    lens_B: torch.Tensor
    first_G: torch.Tensor
    count_G: torch.Tensor


@dataclass
class PrefixGroups:
    """`lens`: each row's shared-prefix tokens (0: none); `groups`: (first row, rows) of each group; `saved_tokens`:
    the K/V token reads per layer the cascade saves (each group's prefix read once instead of once a row);
    `repeated_tokens`: every run's shared blocks counted once per row beyond the first, however short the prefix or
    many the rows (the K/V a step's rows hold in common, which its bandwidth floor counts once)."""
    lens: list[int]
    groups: list[tuple[int, int]]
    saved_tokens: int
    repeated_tokens: int = 0


def find_prefix_groups(tables: list[list[int]], lens: list[int], block_size: int, members: int,
                       min_tokens: int | None = None) -> PrefixGroups:
    """The shared prefixes of a decode step's rows (`tables` their block tables, `lens` their context lengths); a
    prefix shorter than `min_tokens` (MIN_PREFIX_TOKENS when None) is left to the per-row kernel."""
    min_tokens = MIN_PREFIX_TOKENS if min_tokens is None else min_tokens
    B = len(tables)
    plen, groups, saved, repeated = [0] * B, [], 0, 0
    i = 0
    while i < B:
        head = tables[i]
        j = i + 1
        while j < B and head and tables[j] and tables[j][0] == head[0]:
            j += 1
        if j - i >= 2:
            limit = min(min((lens[r] - 1) // block_size, len(tables[r])) for r in range(i, j))
            common = limit
            for r in range(i + 1, j):
                if tables[r][:common] != head[:common]:
                    common = next(c for c in range(common) if tables[r][c] != head[c])
            tokens = common * block_size
            repeated += (j - i - 1) * tokens
            if tokens >= min_tokens and members >= 2:
                parts = -(-(j - i) // members)
                size, extra = divmod(j - i, parts)
                first = i
                for p in range(parts):
                    count = size + (p < extra)
                    if count >= 2:  # a lone row gains nothing: the per-row kernel reads its whole context
                        groups.append((first, count))
                        plen[first:first + count] = [tokens] * count
                        saved += (count - 1) * tokens
                    first += count
        i = j
    return PrefixGroups(plen, groups, saved, repeated)


def use_cascade(found: PrefixGroups, kv_bytes_per_token: int, l2_bytes: int, min_l2_fraction: float | None = None
                ) -> bool:
    """Whether the step's shared prefixes are worth reading once per group: while their K/V (a layer, each group's
    once) fit in `min_l2_fraction` (MIN_L2_FRACTION when None) of the GPU's L2 cache, a group's rows read them
    together from L2 and the per-row kernel is as fast."""
    prefix_bytes = sum(found.lens[first] for first, _ in found.groups) * kv_bytes_per_token
    return bool(found.groups) and cascade_pays(prefix_bytes, l2_bytes, min_l2_fraction)


def cascade_pays(prefix_bytes: int, l2_bytes: int, min_l2_fraction: float | None = None) -> bool:
    """The rule of `use_cascade` on a layer's shared-prefix K/V bytes (each group's once); the plan's forecast
    (plan/cascade.py) asks it too."""
    fraction = MIN_L2_FRACTION if min_l2_fraction is None else min_l2_fraction
    return prefix_bytes >= fraction * l2_bytes
