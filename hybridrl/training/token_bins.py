"""Token-balanced micro-batches (`use_dynamic_bsz`): which rows go into which micro-batch, and the outputs back in
row order.

Choices:
- Greedy longest-first assignment into the fewest bins whose token sums fit `max_token_len` (more bins while any
  overflows).
- The bin count is all-reduced (MAX) over the group so every FSDP rank runs the same number of forwards (unequal
  counts would hang the collectives); a rank with fewer rows than that count fails with what to raise.
- Shared prompts: the rows of a prompt stay together and count its tokens once, as the shared-prompt forward
  runs them; a group over the budget is cut into parts, each with its own copy of the prompt.
- Padded forwards (the reward model's): rows sorted by length and cut in order, so each micro-batch pads little and
  its padded size (rows x its longest) stays within the budget.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybridrl.training.transfer import to_device

__all__ = ["padded_length_bins", "rearrange_micro_batches", "rearrange_prompt_groups", "restore_order"]


def _balanced_bins(lengths: list[int], num_bins: int) -> list[list[int]]:
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    loads = [0] * num_bins
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        b = min(range(num_bins), key=lambda k: (loads[k], k))
        bins[b].append(i)
        loads[b] += lengths[i]
    return [sorted(b) for b in bins]


def _fewest_bins(lengths: list[int], max_token_len: int, key: str) -> int:
    too_long = [n for n in lengths if n > max_token_len]
    if too_long:
        raise ValueError(f"{key}={max_token_len} is smaller than a sequence of {max(too_long)} tokens; "
                         f"raise it to at least the longest prompt+response length")
    if not lengths:
        raise ValueError("rearrange_micro_batches: empty batch")
    num = max(1, -(-sum(lengths) // max_token_len))
    while not all(sum(lengths[i] for i in b) <= max_token_len for b in _balanced_bins(lengths, num)):
        num += 1
    return num


def _agreed_count(num: int, group) -> int:
    """The micro-batch count all ranks of `group` run: the largest any of them needs."""
    if not (dist.is_available() and dist.is_initialized()):
        return num
    t = torch.tensor([num], dtype=torch.int64, device="cuda" if dist.get_backend(group) == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def rearrange_micro_batches(seq_lens: list[int], max_token_len: int, group=None,
                            key: str = "ppo_max_token_len_per_gpu") -> list[list[int]]:
    """Split rows into token-balanced micro-batches of at most max_token_len tokens each.

    Returns lists of row indices (each sorted); every row appears exactly once. With torch.distributed
    initialised, the micro-batch count is the maximum over `group` (default: world).
    """
    if max_token_len <= 0:
        raise ValueError(f"{key} must be > 0, got {max_token_len}")
    n = len(seq_lens)
    num = _agreed_count(_fewest_bins(seq_lens, max_token_len, key), group)
    if num > n:
        raise RuntimeError(f"dynamic bsz: another rank needs {num} micro-batches but this rank has only "
                           f"{n} rows; raise {key} or balance the batch across ranks")
    bins = _balanced_bins(seq_lens, num)
    if any(not b for b in bins):
        raise RuntimeError(f"dynamic bsz produced an empty micro-batch ({num} bins for {n} rows)")
    return bins


def rearrange_prompt_groups(groups: list[list[int]], prompt_lens: list[int], response_lens: list[int],
                            max_token_len: int, group=None, key: str = "ppo_max_token_len_per_gpu"):
    """Dynamic micro-batches for shared-prompt forwards: rows that share a prompt (`groups`, lists of row indices)
    stay together, a group costing its prompt once plus its rows' responses (`prompt_lens[g]`, `response_lens[row]`);
    a group over max_token_len is cut into parts that fit, each with its own copy of the prompt, and groups are
    cut further while this rank has fewer parts than the micro-batch count another rank of `group` needs.
    Returns lists of row indices (each sorted), every row exactly once."""
    if max_token_len <= 0:
        raise ValueError(f"{key} must be > 0, got {max_token_len}")
    units: list[tuple[int, list[int]]] = []   # (prompt length, rows)
    for g, rows in enumerate(groups):
        part: list[int] = []
        for r in rows:
            if part and prompt_lens[g] + sum(response_lens[i] for i in part) + response_lens[r] > max_token_len:
                units.append((prompt_lens[g], part))
                part = []
            part.append(r)
        units.append((prompt_lens[g], part))

    def costs():
        return [p + sum(response_lens[i] for i in rows) for p, rows in units]

    num = _agreed_count(_fewest_bins(costs(), max_token_len, key), group)
    _split_to(units, num, key)
    return [sorted(r for u in b for r in units[u][1]) for b in _balanced_bins(costs(), num)]


def _split_to(units: list[tuple[int, list[int]]], num: int, key: str) -> None:
    """Halve the (prompt length, rows) unit with the most rows, each half keeping the prompt, until there are `num`
    units (the micro-batch count another rank needs)."""
    while len(units) < num:
        widest = max(range(len(units)), key=lambda u: len(units[u][1]))
        p, rows = units[widest]
        if len(rows) < 2:
            raise RuntimeError(f"dynamic bsz: another rank needs {num} micro-batches but this rank has only "
                               f"{sum(len(r) for _, r in units)} rows; raise {key} or balance the batch across ranks")
        units[widest:widest + 1] = [(p, rows[:len(rows) // 2]), (p, rows[len(rows) // 2:])]


def padded_length_bins(seq_lens: list[int], max_tokens: int, group=None,
                       key: str = "forward_max_token_len_per_gpu") -> list[list[int]]:
    """Micro-batches for a padded forward (each pads its rows to its longest): rows sorted by length, longest first,
    each micro-batch as many consecutive ones as keep rows x longest within `max_tokens`; with torch.distributed
    initialised, the count is the largest any rank of `group` needs (the micro-batch with the most rows is halved
    until this rank has as many). Returns lists of row indices (each sorted), every row exactly once."""
    if max_tokens <= 0:
        raise ValueError(f"{key} must be > 0, got {max_tokens}")
    if not seq_lens:
        raise ValueError("padded_length_bins: empty batch")
    if max(seq_lens) > max_tokens:
        raise ValueError(f"{key}={max_tokens} is smaller than a sequence of {max(seq_lens)} tokens; raise it to at "
                         "least the longest input")
    bins: list[list[int]] = []
    for i in sorted(range(len(seq_lens)), key=lambda j: (-seq_lens[j], j)):
        if bins and (len(bins[-1]) + 1) * seq_lens[bins[-1][0]] <= max_tokens:
            bins[-1].append(i)
        else:
            bins.append([i])
    units = [(0, b) for b in bins]   # no prompt to keep
    _split_to(units, _agreed_count(len(bins), group), key)
    return [sorted(rows) for _, rows in units]


def restore_order(chunks: list[torch.Tensor], bins: list[list[int]] | None) -> torch.Tensor:
    """Concatenate per-micro-batch outputs and put rows back in their original order (`bins`: each micro-batch's
    row indices, from dynamic batching; None: the micro-batches are already in order)."""
    out = torch.cat(chunks, dim=0)
    if bins is None:
        return out
    order = torch.tensor([i for b in bins for i in b], dtype=torch.long)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return out[to_device(inverse, out.device)]
