"""Sequence packing (`use_remove_padding`) and token-balanced micro-batches (`use_dynamic_bsz`).

Shapes: B rows, S padded length, R response length, T packed (valid) tokens, V vocab / head width C.

Choices:
- Packing keeps only the valid tokens of a micro-batch, in row order, in one row [1, T]; position ids are the
  batch's own (they restart per sequence: cumsum(mask) - 1), and the sequence boundaries travel as
  `cu_seq_lens_q/k` (the FlashAttention kwarg names, which HF models pass down to the attention function).
- Attention runs through our function registered with transformers' `AttentionInterface` under
  `VARLEN_ATTN`: on CUDA in bf16/fp16, FlashAttention's varlen kernel as torch ships it (training/flash_segments.py;
  on an H200 its backward was several times faster than FlexAttention's on long documents); else FlexAttention
  with a document mask on CUDA (compiled once; rows of 128 tokens or more), else SDPA with a block-diagonal causal
  mask. Without `cu_seq_lens_q`
  it delegates to HF's SDPA function, so the same model also runs the padded path. A matching mask function
  returns None when no 2-D padding mask is given (packed or unpadded input: the attention function owns
  causality) and HF's SDPA mask otherwise.
- Shared prompts (`actor.use_prefix_grouper`, GRPO's n samples of a prompt in one micro-batch): the prompt is
  packed once per document, then each row's response; a response token attends to its document's prompt and its
  own response only, so outputs and gradients are those of the unshared rows (the prompt's activations receive
  the sum of its rows' gradients, as its copies' parameter gradients summed before) in (P + n·R) tokens instead of
  n·(P + R).
- Only the positions that predict response tokens are sent through the head (`logits_to_keep` with an index
  tensor for causal LMs), so the [T, V] logits of the prompt are never materialised.
- Ulysses sequence parallelism (`sp_group`, training/ulysses.py): the packed row is split over the SP ranks,
  the attention function all-to-alls q/k/v to whole sequences and back, and the kept head rows are gathered.
- Per-token data of the forward (`token_data`, [B, S, ...] tensors: the MoE routing taps' valid-token mask and
  replayed experts, training/moe.py) is laid out like the model's input tokens (`tokens_as_input`: the padded rows
  flattened, or the packed row, a shared prompt's values from its group's first row, and under Ulysses this
  rank's slice, zero-padded like the tokens) and handed to `on_tokens` just before the model runs.
- Dynamic batching: greedy longest-first assignment into the fewest bins whose token sums fit
  `max_token_len` (more bins while any overflows); the bin count is all-reduced (MAX) over the group so every
  FSDP rank runs the same number of forwards (unequal counts would hang the collectives).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hybridrl.training.flash_segments import (
    FlashSegments,
    flash_segments,
    flash_usable,
    flash_varlen_attention,
)
from hybridrl.training.transfer import to_device
from hybridrl.training.ulysses import SequenceParallel, gather_rows, ulysses_out, ulysses_qkv

VARLEN_ATTN = "hybridrl_varlen"

__all__ = ["VARLEN_ATTN", "PackedInputs", "SharedPrompts", "pack_inputs", "prompt_groups", "tokens_as_input",
           "register_varlen_attention", "forward_response_logits", "rearrange_micro_batches",
           "rearrange_prompt_groups", "restore_order"]


@dataclass
class SharedPrompts:
    """The layout of a packed row in which each prompt appears once, followed by the responses of every row that
    has it: per packed token its segment (its group's prompt, or its row's response) and whether it is a prompt
    token (one that every response of its document attends to)."""
    segment: torch.Tensor        # [T] long
    is_prompt: torch.Tensor      # [T] bool


@dataclass
class PackedInputs:
    input_ids: torch.Tensor      # [1, T]
    position_ids: torch.Tensor   # [1, T]
    cu_seqlens: torch.Tensor     # [D+1] int32: documents (a row each; a prompt group each with shared prompts)
    max_seqlen: int
    packed_of_flat: torch.Tensor  # [B*S] packed position of each padded position (-1: padding); the positions of
                                  # a shared prompt's rows all map to its one copy
    shared: SharedPrompts | None = None
    flash: FlashSegments | None = None   # the same layout as FlashAttention's varlen kernel takes it

    def to(self, device) -> PackedInputs:
        shared = None if self.shared is None else SharedPrompts(to_device(self.shared.segment, device),
                                                                to_device(self.shared.is_prompt, device))
        return PackedInputs(to_device(self.input_ids, device), to_device(self.position_ids, device),
                            to_device(self.cu_seqlens, device), self.max_seqlen,
                            to_device(self.packed_of_flat, device), shared,
                            None if self.flash is None else self.flash.to(device))


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                  prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose first prompt_len columns (tokens, padding and positions) are equal share a prompt:
    ([B] group of each row, numbered in the order of their first rows; [B] that first row)."""
    bsz = input_ids.shape[0]
    prompt_mask = attention_mask[:, :prompt_len].bool()
    key = torch.cat([input_ids[:, :prompt_len].masked_fill(~prompt_mask, -1),
                     position_ids[:, :prompt_len].masked_fill(~prompt_mask, -1)], 1)
    _, group = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(bsz, device=input_ids.device)
    first = torch.full((int(group.max()) + 1,), bsz, device=input_ids.device).scatter_reduce(0, group, rows, "amin")
    return torch.argsort(torch.argsort(first))[group], first[group]


def pack_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                prompt_len: int | None = None) -> PackedInputs:
    """The valid tokens of [B, S] padded rows as one packed row. prompt_len: share prompts — rows whose first
    prompt_len columns (tokens, padding and positions) are equal form one document, their prompt once, then each
    row's response in row order; documents in the order of their first row (`prompt_groups`)."""
    mask = attention_mask.bool()
    bsz, seq_len = mask.shape
    dev = input_ids.device
    if prompt_len is None:
        keep, doc_of_row, leader = mask, torch.arange(bsz, device=dev), None
    else:
        doc_of_row, leader = prompt_groups(input_ids, attention_mask, position_ids, prompt_len)
        rows = torch.arange(bsz, device=dev)
        cols = torch.arange(seq_len, device=dev)
        keep = mask & ((cols >= prompt_len)[None, :] | (rows == leader)[:, None])
    flat = keep.reshape(-1).nonzero(as_tuple=True)[0]
    row, col = flat // seq_len, flat % seq_len
    if prompt_len is not None:  # document by document: its prompt, then its rows' responses
        span = bsz * seq_len
        flat = flat[torch.argsort(doc_of_row[row] * 2 * span + (col >= prompt_len) * span + flat)]
        row, col = flat // seq_len, flat % seq_len
    total = flat.numel()
    packed_of_flat = torch.full((bsz * seq_len,), -1, dtype=torch.long, device=dev)
    packed_of_flat[flat] = torch.arange(total, device=dev)
    shared = None
    if prompt_len is not None:
        by_row = packed_of_flat.view(bsz, seq_len)
        by_row[:, :prompt_len] = by_row[leader, :prompt_len]
        is_prompt = col < prompt_len
        shared = SharedPrompts(torch.where(is_prompt, bsz + doc_of_row[row], row), is_prompt)
    lens = torch.bincount(doc_of_row[row], minlength=int(doc_of_row.max()) + 1 if bsz else 0)
    cu = F.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    flash = flash_segments(cu, *((shared.segment, shared.is_prompt) if shared is not None else ()))
    return PackedInputs(input_ids.reshape(-1)[flat].unsqueeze(0), position_ids.reshape(-1)[flat].unsqueeze(0),
                        cu, int(lens.max().item()) if lens.numel() else 0, packed_of_flat, shared, flash)


def tokens_as_input(values: torch.Tensor, packed: PackedInputs | None) -> torch.Tensor:
    """[B, S, ...] per-token values in the order the model sees the tokens: [B*S, ...] (padded rows) or [T, ...]
    (the packed row; a shared prompt's position takes its group's first row's value)."""
    flat_values = values.reshape(-1, *values.shape[2:])
    if packed is None:
        return flat_values
    where = packed.packed_of_flat.to(values.device)
    kept = where >= 0
    flat = torch.arange(where.numel(), device=values.device)[kept]
    first = torch.full((packed.input_ids.shape[1],), where.numel(), dtype=torch.long, device=values.device)
    first = first.scatter_reduce(0, where[kept], flat, "amin")
    return flat_values[first]


def _lay_out(token_data: dict | None, packed: PackedInputs | None, device) -> dict | None:
    if not token_data:
        return None
    return {k: to_device(tokens_as_input(v, packed), device) for k, v in token_data.items()}


# ---------------------------------------------------------------------------------------------- attention
def _doc_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(lens.numel(), device=cu_seqlens.device), lens, output_size=total)


def _allowed(cu_seqlens: torch.Tensor, total: int, shared: SharedPrompts | None):
    """mask_mod(b, h, q_idx, kv_idx) of a packed row: causal within each document; with shared prompts a response
    token also sees only its document's prompt and its own response (not its siblings')."""
    docs = _doc_ids(cu_seqlens, total)
    if shared is None:
        def doc_causal(b, h, q_idx, kv_idx):
            return (docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
        return doc_causal
    segment, is_prompt = shared.segment, shared.is_prompt

    def prompt_shared(b, h, q_idx, kv_idx):
        return ((docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
                & (is_prompt[kv_idx] | (segment[q_idx] == segment[kv_idx])))
    return prompt_shared


_compiled_flex = None
# For a 112-token packed row inductor found no kernel configuration for the compiled training forward
# (NoValidChoicesError, H200, torch 2.11; rows of 219 tokens and more compiled): rows shorter than one FlexAttention
# block (128) take the dense mask, which costs nothing at that size.
FLEX_MIN_TOKENS = 128


def _flex_attention(query, key, value, cu_seqlens, scaling, shared):
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    total = query.shape[2]
    # One block mask per forward: cached on the cu_seqlens tensor (the same object reaches every layer).
    cached = getattr(cu_seqlens, "_hybridrl_block_mask", None)
    if cached is None:
        cached = create_block_mask(_allowed(cu_seqlens, total, shared), None, None, total, total,
                                   device=query.device)
        cu_seqlens._hybridrl_block_mask = cached
    enable_gqa = query.shape[1] != key.shape[1]
    return _compiled_flex(query, key, value, block_mask=cached, scale=scaling, enable_gqa=enable_gqa)


def _sdpa_block_diagonal(query, key, value, cu_seqlens, scaling, shared):
    total = query.shape[2]
    pos = torch.arange(total, device=query.device)
    mask = _allowed(cu_seqlens, total, shared)(None, None, pos[:, None], pos[None, :])
    if key.shape[1] != query.shape[1]:
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask[None, None], scale=scaling)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             sliding_window=None, **kwargs):
    """query [1, H, T, D], key/value [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got batch {query.shape[0]}")
    if sliding_window is not None:
        raise ValueError(f"packed attention does not implement sliding_window={sliding_window}; "
                         "set use_remove_padding=false for sliding-window models")
    sp = kwargs.get("sp_group")
    if sp is not None:  # [T_loc tokens, all heads] -> [all tokens, heads / P]
        query, key, value = ulysses_qkv(query, key, value, sp)
    shared = kwargs.get("shared_prompts")
    flash = kwargs.get("flash_segments")
    if flash is not None and flash_usable(query):
        out = flash_varlen_attention(query, key, value, flash, scaling)
    elif query.is_cuda and not torch.compiler.is_compiling() and query.shape[2] >= FLEX_MIN_TOKENS:
        out = _flex_attention(query, key, value, cu, scaling, shared)
    else:
        out = _sdpa_block_diagonal(query, key, value, cu, scaling, shared)
    out = out.transpose(1, 2)
    if sp is not None:
        out = ulysses_out(out, sp)
    return out.contiguous(), None


def _varlen_mask(*args, attention_mask=None, **kwargs):
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_varlen_attention() -> str:
    """Register the packed attention (idempotent) and return its name for `set_attn_implementation`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTN, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_ATTN, _varlen_mask)
    return VARLEN_ATTN


# ---------------------------------------------------------------------------------------------- forward
@contextmanager
def _replaced_head(module, head_rows, flat: torch.Tensor, drop_last: bool = False):
    """While active, the model's output head returns head_rows(hidden [K, H], weight, flat) instead of logits:
    the [K, M] rows as head_rows made them, which the caller shapes. Not reshaped to the hidden's batch shape
    here: that view would be the FSDP root's output, the tensor FSDP2 hooks for its pre-backward all-gather,
    and it warns that an in-place op on a view drops that hook.
    drop_last: the head sees [B, R+1, H] (padded path); the last position predicts no response token."""
    if head_rows is None:
        yield
        return
    head = module.get_output_embeddings()

    def forward(hidden):
        if drop_last:
            hidden = hidden[:, :-1]
        return head_rows(hidden.reshape(-1, hidden.shape[-1]), head.weight, flat)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def _response_predictor_positions(batch: int, seq_len: int, response_length: int, device) -> torch.Tensor:
    """[B, R] flat indices into [B*S] of the positions whose output predicts each response token."""
    cols = torch.arange(seq_len - response_length - 1, seq_len - 1, device=device)
    return (torch.arange(batch, device=device)[:, None] * seq_len + cols[None, :])


def forward_response_logits(module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                            position_ids: torch.Tensor, response_length: int, use_remove_padding: bool,
                            keep_only_needed: bool = True, sp_group=None, row_fn=None,
                            head_rows=None, share_prompts: bool = False, device=None, token_data=None,
                            on_tokens=None) -> torch.Tensor:
    """Run the model and return the head outputs at the positions predicting the last R tokens: [B, R, C].

    Positions whose predicting token is padding hold zeros (finite; callers mask them with response_mask).
    keep_only_needed: pass `logits_to_keep` (causal LMs); False for heads without that argument (critic).
    sp_group: Ulysses sequence-parallel group (every rank of it passes the same batch; packed path only).
    row_fn(rows [K, C], flat [K]) -> [K, M]: reduces the kept rows (flat = their indices into the [B*R] response
      positions) before they are scattered into [B, R, M] — and, under Ulysses, before they are gathered, so a
      log-prob pass moves M = 1-2 numbers a row between ranks instead of a vocabulary's width.
    head_rows(hidden [K, H], head weight [C, H], flat [K]) -> [K, M]: replaces the model's output head for the
      kept rows (inside the model's forward, so FSDP's unsharded head weight and its gradient hooks apply), so
      the [K, C] logits are never returned (give row_fn or head_rows, not both).
    share_prompts: rows with the same prompt (the first S - R columns) run it once (`pack_inputs`); the prompt's
      last position predicts every such row's first response token. The same outputs and gradients as unshared, in
      fewer tokens; packs the micro-batch whatever use_remove_padding says (not with Ulysses).
    device: where the model runs (None: the inputs' device). The packed layout is index arithmetic with
      data-dependent sizes: made where the inputs are — the host, for rows from the controller, so the host never
      waits for the GPU's queue to drain — then moved there.
    token_data ({name: [B, S, ...]}) / on_tokens(dict): the per-token data laid out like the model's input tokens
      ([N, ...] on `device`; see the module docstring), handed over just before the model runs.
    """
    bsz, seq_len = input_ids.shape
    if sp_group is not None and share_prompts:
        raise ValueError("shared prompts (actor.use_prefix_grouper) do not go with Ulysses sequence parallelism")
    sp = SequenceParallel.from_group(sp_group)
    if sp is not None and not use_remove_padding:
        raise ValueError("Ulysses sequence parallelism needs the packed path (model.use_remove_padding=true)")
    use_remove_padding = use_remove_padding or share_prompts
    if head_rows is not None and (row_fn is not None or not keep_only_needed):
        raise ValueError("head_rows replaces the head's logits: it needs keep_only_needed=True and no row_fn")
    row_fn = row_fn or (lambda rows, flat: rows)
    device = input_ids.device if device is None else torch.device(device)
    on_tokens = on_tokens or (lambda laid_out: None)
    if not use_remove_padding:
        input_ids, attention_mask, position_ids = (to_device(t, device) for t in (input_ids, attention_mask,
                                                                                  position_ids))
        on_tokens(_lay_out(token_data, None, device))
    if not use_remove_padding and head_rows is not None:
        flat = torch.arange(bsz * response_length, device=input_ids.device)
        with _replaced_head(module, head_rows, flat, drop_last=True):
            rows = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False, logits_to_keep=response_length + 1).logits
        return rows.reshape(bsz, response_length, -1)
    if not use_remove_padding:
        kwargs = {"logits_to_keep": response_length + 1} if keep_only_needed else {}
        logits = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        use_cache=False, **kwargs).logits[:, -response_length - 1:-1]
        flat = torch.arange(bsz * response_length, device=input_ids.device)
        rows = row_fn(logits.reshape(bsz * response_length, -1), flat)
        return rows.reshape(bsz, response_length, -1)
    packed = pack_inputs(input_ids, attention_mask, position_ids,
                         seq_len - response_length if share_prompts else None)
    wanted = packed.packed_of_flat[_response_predictor_positions(bsz, seq_len, response_length, input_ids.device)]
    valid = wanted >= 0
    flat = to_device(valid.reshape(-1).nonzero(as_tuple=True)[0], device)  # kept rows as indices into [B*R]
    keep = to_device(wanted[valid], device)                                # their packed positions
    laid_out = _lay_out(token_data, packed, device)
    packed = packed.to(device)
    kwargs = dict(cu_seq_lens_q=packed.cu_seqlens, cu_seq_lens_k=packed.cu_seqlens,
                  max_length_q=packed.max_seqlen, max_length_k=packed.max_seqlen, use_cache=False)
    if packed.shared is not None:
        kwargs["shared_prompts"] = packed.shared
    if packed.flash is not None:
        kwargs["flash_segments"] = packed.flash
    if sp is not None:
        rows = _sequence_parallel_rows(module, packed, keep, flat, kwargs, sp, keep_only_needed, row_fn, head_rows,
                                       laid_out, on_tokens)
    elif keep_only_needed:
        on_tokens(laid_out)
        with _replaced_head(module, head_rows, flat):
            logits = module(input_ids=packed.input_ids, position_ids=packed.position_ids, logits_to_keep=keep,
                            **kwargs).logits
        rows = row_fn(logits if head_rows is not None else logits[0], flat)          # [K, M]
    else:
        on_tokens(laid_out)
        logits = module(input_ids=packed.input_ids, position_ids=packed.position_ids, **kwargs).logits[0]
        rows = row_fn(logits[keep], flat)
    out = rows.new_zeros(bsz * response_length, rows.shape[-1])
    out[flat] = rows
    return out.reshape(bsz, response_length, -1)


def _sequence_parallel_rows(module, packed: PackedInputs, keep: torch.Tensor, flat: torch.Tensor, kwargs: dict,
                            sp: SequenceParallel, keep_only_needed: bool, row_fn, head_rows, laid_out,
                            on_tokens) -> torch.Tensor:
    """This rank's slice of the packed row through the model; returns every rank's reduced kept rows [K, M].
    `keep` (packed indices) is increasing — packing keeps row order — so rank order is row order."""
    total = packed.input_ids.shape[1]
    pad = -total % sp.size
    ids, pos, cu = packed.input_ids, packed.position_ids, packed.cu_seqlens
    if pad:  # the padding is one more document: nothing real attends to it
        ids = F.pad(ids, (0, pad))
        pos = torch.cat([pos, torch.arange(pad, device=pos.device, dtype=pos.dtype)[None]], 1)
        cu = torch.cat([cu, cu.new_tensor([total + pad])])
    local = (total + pad) // sp.size
    lo = sp.rank * local
    owner = keep // local
    sizes = torch.bincount(owner, minlength=sp.size).tolist()
    kwargs = {**kwargs, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "sp_group": sp}
    if pad and packed.flash is not None:
        longest = max(packed.flash.max_q, pad)
        kwargs["flash_segments"] = FlashSegments(cu, cu, longest, longest, None)
    mine = owner == sp.rank
    ids, pos = ids[:, lo:lo + local], pos[:, lo:lo + local]
    # the per-token data of this rank's slice, zero-padded like the tokens
    on_tokens(None if laid_out is None else
              {k: torch.cat([v, v.new_zeros(pad, *v.shape[1:])])[lo:lo + local] for k, v in laid_out.items()})
    if keep_only_needed:
        with _replaced_head(module, head_rows, flat[mine]):
            rows = module(input_ids=ids, position_ids=pos, logits_to_keep=keep[mine] - lo, **kwargs).logits
        rows = rows if head_rows is not None else rows[0]
    else:  # heads without logits_to_keep (the critic's value head): the whole slice, then this rank's rows
        rows = module(input_ids=ids, position_ids=pos, **kwargs).logits[0][keep[mine] - lo]
    return gather_rows(row_fn(rows, flat[mine]), sizes, sp)


# ---------------------------------------------------------------------------------------------- dynamic bsz
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
    while len(units) < num:
        widest = max(range(len(units)), key=lambda u: len(units[u][1]))
        p, rows = units[widest]
        if len(rows) < 2:
            raise RuntimeError(f"dynamic bsz: another rank needs {num} micro-batches but this rank has only "
                               f"{sum(len(r) for _, r in units)} rows; raise {key} or balance the batch across ranks")
        units[widest:widest + 1] = [(p, rows[:len(rows) // 2]), (p, rows[len(rows) // 2:])]
    return [sorted(r for u in b for r in units[u][1]) for b in _balanced_bins(costs(), num)]


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
