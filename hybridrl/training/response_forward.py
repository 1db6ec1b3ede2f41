"""The training forward of the actor, the critic and the SFT trainer: run the model on a micro-batch, padded or
packed, and return the head's outputs at the positions that predict response tokens, [B, R, C].

Shapes: B rows, S padded length, R response length, T packed (valid) tokens, K kept rows, V vocab / head width C.

Choices:
- Packed (`use_remove_padding`, or shared prompts): the micro-batch becomes one packed row (training/packing.py)
  and the documents' boundaries go to the model as `cu_seq_lens_q/k` for the packed attention
  (training/packed_attention.py, registered as the model's attention implementation).
- Only the positions that predict response tokens are sent through the head (`logits_to_keep` with an index
  tensor for causal LMs), so the [T, V] logits of the prompt are never materialised; `row_fn` reduces them, or
  `head_rows` replaces the head itself (the fused log-prob head), before anything [K, V] leaves the model.
- Ulysses sequence parallelism (`sp_group`, training/ulysses.py): the packed row is split over the SP ranks
  (padded to a multiple of their count with one more document), and the kept head rows, reduced first, are
  gathered.
- Per-token data of the forward (`token_data`, [B, S, ...] tensors: the MoE routing taps' valid-token mask and
  replayed experts, training/moe.py) is laid out like the model's input tokens (`tokens_as_input`: the padded rows
  flattened, or the packed row, a shared prompt's values from its group's first row, and under Ulysses this
  rank's slice, zero-padded like the tokens) and handed to `on_tokens` just before the model runs.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from hybridrl.training.flash_segments import FlashSegments
from hybridrl.training.packed_attention import mask_unread, no_mask
from hybridrl.training.packing import PackedInputs, pack_inputs, tokens_as_input
from hybridrl.training.transfer import to_device
from hybridrl.training.ulysses import SequenceParallel, gather_rows

__all__ = ["forward_response_logits"]


def _lay_out(token_data: dict | None, packed: PackedInputs | None, device) -> dict | None:
    if not token_data:
        return None
    return {k: to_device(tokens_as_input(v, packed), device) for k, v in token_data.items()}


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
    # max_key_span: no token attends over more than its padded row, so a sliding window at least that wide never
    # binds and the packed (full) attention is the model's own
    kwargs = dict(cu_seq_lens_q=packed.cu_seqlens, cu_seq_lens_k=packed.cu_seqlens,
                  max_length_q=packed.max_seqlen, max_length_k=packed.max_seqlen, max_key_span=seq_len,
                  use_cache=False)
    if mask_unread(module):
        kwargs["attention_mask"] = no_mask()
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
