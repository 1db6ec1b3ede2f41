"""Triton paged-attention decode kernel (one query token per sequence), split over the context when the batch is
small.

Choices (gathering the paged cache then SDPA costs ~10x the K/V read):
- One program per (sequence, kv head, context split): it loads the G = N/K query heads of that group as one
  [G_pad, D] tile (G padded to 16 for tl.dot) and streams its part of the sequence's K/V once, BLOCK_N tokens
  at a time, looking up each token's physical block in the block table (so BLOCK_N may span several pages).
  Online softmax in fp32 (exp2); fp32 inputs use IEEE dots (tests).
- Split-K over the context (flash-decoding): with few sequences, B x K programs leave most of the GPU's SMs
  idle while each streams a long context alone — the tail of a long rollout, where a handful of sequences run
  at 4k-16k tokens. `num_splits` programs then share a sequence's context (each ctx/num_splits tokens, rounded
  to BLOCK_N; splits past the end store an empty partial) and write unnormalised partial outputs with their
  running max and sum; a second kernel merges them (the exact softmax: partials rescaled to the common max).
  `decode_splits` picks the count from the batch size so that programs fill the SMs four times over, in splits
  of at least 64 tokens, and none once the batch alone fills every SM twice; 1 = the single-pass kernel writes the
  output directly. Swept on an H200 (benchmarks/results/long_tail/decode_kernels.json, each layer on its own
  K/V): against twice over in splits of at least 256 tokens, 14.7 vs 16.1 us a layer at 8 sequences x 3.7k
  tokens, 69.9 vs 80.2 at 64 x 4k, 37.4 vs 43.3 at 8 x 16k, 7.5 vs 11.8 at 1 x 4k; a split batch of 256 x 1k
  was slower (78 vs 73 us), hence no split there. Tiles other than 64 tokens x 4 warps x 2 stages won by
  at most 1-2 us and on some shapes only.
- Cascade (`prefix`, rollout/shared_prefix.py): rows whose leading blocks are shared (a prompt's n samples) are
  grouped; the same launch runs, beside the rows' programs over their tokens after the prefix, one program per
  (group, kv head, prefix chunk) whose query tile stacks the group's rows x GROUP heads (at most 64 rows), so the
  prefix is read once per group instead of once per row; its partials go to extra slots that the merge folds in.
  One launch, so the prefix programs overlap the rows'. Chunks: at most PREFIX_SPLITS, each >= MIN_PREFIX_CHUNK
  tokens; programs past a short prefix's chunks exit.
- Trip counts come from `context_lens` read on the device and the split count is fixed per batch size, so the
  kernels are CUDA-graph safe (a graph bucket is captured at one batch size). The split count is a runtime argument
  that Triton does not specialise on: two compiled kernels serve every batch size, the single-pass one (DIRECT: one
  slot, the normalised output stored directly) and the partials one (as a constexpr the count compiled once per
  distinct value, about nine across the graph buckets, each compile in the first rollout's time).
- Imported lazily: CPU machines without triton never import this module.

Shape legend: B sequences, N q heads, K kv heads, D head_dim, M blocks per sequence, P context splits.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from hybridrl.rollout.shared_prefix import SharedPrefix, prefix_members

MIN_SPLIT_TOKENS = 64    # a split streams at least this many tokens (else the merge costs more than it gains)
PROGRAMS_PER_SM = 4      # split until the programs fill every SM this many times
PREFIX_SPLITS = 4        # programs a shared prefix is cut into at most (cascade), each ...
MIN_PREFIX_CHUNK = 256   # ... streaming at least this many of its tokens


@triton.jit
def _attend_span(q, KC, VC, bt_row, lo, hi, kvh, scale_log2e, s_cb, s_ct, s_ch,
                 ROWS: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                 PRECISION: tl.constexpr):
    """Online softmax of the query tile q [ROWS, D] over positions [lo, hi) of one block table row (`bt_row`
    points at it): the unnormalised output, its running max (log2 units) and sum."""
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK_N)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + n
        valid = pos < hi
        blk = tl.load(bt_row + pos // PAGE, mask=valid, other=0).to(tl.int64)
        off = blk * s_cb + (pos % PAGE) * s_ct + kvh * s_ch
        k = tl.load(KC + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2e
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VC + off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _prefix_chunk(plen, PSPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr):
    """Tokens of a shared prefix one program streams: a PSPLITS-th of it in whole tiles, at least MIN_CHUNK (a short
    prefix takes fewer programs; the rest exit)."""
    return tl.maximum(tl.cdiv(tl.cdiv(plen, PSPLITS), BLOCK_N) * BLOCK_N, MIN_CHUNK)


@triton.jit(do_not_specialize=["SPLITS", "s_mb", "s_mh"])   # (the partials' strides follow the split count)
def _paged_decode_kernel(Q, KC, VC, Out, Mx, Sm, BT, CL, PL, GS, GN, NG, scale_log2e,
                         s_qb, s_qh, s_cb, s_ct, s_ch, s_btb, s_ob, s_oh, s_op, s_mb, s_mh, SPLITS,
                         DIRECT: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                         PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                         CASCADE: tl.constexpr, MEMBERS: tl.constexpr, ROWS_PAD: tl.constexpr,
                         PSPLITS: tl.constexpr, MIN_CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (NG + B, K, max(SPLITS, PSPLITS)). Programs [NG, NG + B) of axis 0: row b = pid - NG, context split
    `split` of its tokens after the shared prefix (PL[b], 0 without CASCADE). Programs [0, NG) (CASCADE only): prefix
    group g = pid — the queries of its GN[g] consecutive rows from GS[g] against the PL[GS[g]] tokens they share,
    read once through the first row's block table — prefix chunk `split`, written at slot SPLITS + split. Both kinds
    run in one launch, so the prefix work overlaps the rows'."""
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    d = tl.arange(0, D)
    if pid >= NG:
        b = pid - NG
        if split < SPLITS:
            ctx = tl.load(CL + b)
            base = 0
            if CASCADE:
                base = tl.load(PL + b)
            if DIRECT:  # the whole context in one program
                lo = base
                hi = ctx
            else:
                chunk = tl.cdiv(tl.cdiv(ctx - base, SPLITS), BLOCK_N) * BLOCK_N
                lo = base + split * chunk
                hi = tl.minimum(lo + chunk, ctx)
            g = tl.arange(0, GROUP_PAD)
            gmask = g < GROUP
            head = kvh * GROUP + g
            q = tl.load(Q + b * s_qb + head[:, None] * s_qh + d[None, :], mask=gmask[:, None], other=0.0)
            acc, m_i, l_i = _attend_span(q, KC, VC, BT + b * s_btb, lo, hi, kvh, scale_log2e, s_cb, s_ct, s_ch,
                                         GROUP_PAD, D, PAGE, BLOCK_N, PRECISION)
            if DIRECT:  # one slot (no split, no cascade): the normalised output
                out = acc / l_i[:, None]
                tl.store(Out + b * s_ob + head[:, None] * s_oh + d[None, :], out.to(Out.dtype.element_ty),
                         mask=gmask[:, None])
            else:  # unnormalised partial, its max (log2 units) and sum; an empty split stores (0, -inf, 0)
                tl.store(Out + b * s_ob + head[:, None] * s_oh + split * s_op + d[None, :], acc, mask=gmask[:, None])
                tl.store(Mx + b * s_mb + head * s_mh + split, m_i, mask=gmask)
                tl.store(Sm + b * s_mb + head * s_mh + split, l_i, mask=gmask)
    elif CASCADE:
        count = tl.load(GN + pid)
        if count > 0 and split < PSPLITS:
            first = tl.load(GS + pid)
            plen = tl.load(PL + first)
            chunk = _prefix_chunk(plen, PSPLITS, BLOCK_N, MIN_CHUNK)
            lo = split * chunk
            if lo < plen:
                r = tl.arange(0, ROWS_PAD)
                rmask = (r // GROUP < count) & (r < MEMBERS * GROUP)
                row = first + r // GROUP
                head = kvh * GROUP + r % GROUP
                q = tl.load(Q + row[:, None] * s_qb + head[:, None] * s_qh + d[None, :], mask=rmask[:, None],
                            other=0.0)
                acc, m_i, l_i = _attend_span(q, KC, VC, BT + first * s_btb, lo, tl.minimum(lo + chunk, plen), kvh,
                                             scale_log2e, s_cb, s_ct, s_ch, ROWS_PAD, D, PAGE, BLOCK_N, PRECISION)
                slot = SPLITS + split
                tl.store(Out + row[:, None] * s_ob + head[:, None] * s_oh + slot * s_op + d[None, :], acc,
                         mask=rmask[:, None])
                tl.store(Mx + row * s_mb + head * s_mh + slot, m_i, mask=rmask)
                tl.store(Sm + row * s_mb + head * s_mh + slot, l_i, mask=rmask)


@triton.jit(do_not_specialize=["SPLITS", "s_mb", "s_mh"])
def _merge_splits_kernel(Part, Mx, Sm, Out, PL, s_pb, s_ph, s_pp, s_mb, s_mh, s_ob, s_oh, SPLITS,
                         D: tl.constexpr, PSPLITS: tl.constexpr, SLOTS_PAD: tl.constexpr,
                         BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr):
    """Slots [0, SPLITS) are the context splits; SPLITS + c the shared prefix's chunk c, for the chunks PL[b] has."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SLOTS_PAD)
    d = tl.arange(0, D)
    if PSPLITS > 0:
        plen = tl.load(PL + b)
        chunks = tl.where(plen > 0, tl.cdiv(plen, _prefix_chunk(plen, PSPLITS, BLOCK_N, MIN_CHUNK)), 0)
        live = sp < SPLITS + chunks
    else:
        live = sp < SPLITS
    m = tl.load(Mx + b * s_mb + h * s_mh + sp, mask=live, other=float("-inf"))
    l_s = tl.load(Sm + b * s_mb + h * s_mh + sp, mask=live, other=0.0)
    m_all = tl.max(m, 0)  # finite: the first split always holds a token
    w = tl.exp2(m - m_all)  # 0 for empty splits
    part = tl.load(Part + b * s_pb + h * s_ph + sp[:, None] * s_pp + d[None, :], mask=live[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.sum(l_s * w, 0)
    tl.store(Out + b * s_ob + h * s_oh + d, out.to(Out.dtype.element_ty))


@functools.lru_cache(maxsize=8)
def num_sms(device_index: int) -> int:
    """The GPU's SM count, asked once per device (the split choices read it every decode step)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_splits(batch: int, kv_heads: int, max_context: int, num_sms: int, block_n: int = 64,
                  programs_per_sm: int = PROGRAMS_PER_SM, min_split_tokens: int = MIN_SPLIT_TOKENS) -> int:
    """Context splits per (sequence, kv head): enough programs to fill every SM `programs_per_sm` times, each split
    at least `min_split_tokens` of the longest possible context; 1 when the batch alone fills every SM twice."""
    if batch * kv_heads >= 2 * num_sms:
        return 1
    want = -(-programs_per_sm * num_sms // max(1, batch * kv_heads))
    most = max(1, max_context // max(min_split_tokens, block_n))
    return int(max(1, min(want, most)))


def paged_decode_triton(q_BND, k_cache, v_cache, block_tables_BM, context_lens_B, scale, block_n: int = 64,
                        num_splits: int | None = None, num_warps: int = 4, num_stages: int = 2,
                        prefix: SharedPrefix | None = None):
    """Attention of one query per sequence over its paged K/V. num_splits: context splits (None: decode_splits
    for this batch and the block table's capacity); block_n / num_warps / num_stages: the kernel's tile and launch
    (benchmarks/decode_kernels.py sweeps them). `prefix`: cascade attention, where each group's shared prefix is read
    once for all its rows and the rest of each row's context as usual; the two merge exactly (partial softmaxes)."""
    B, N, D = q_BND.shape
    page, K = k_cache.shape[1], k_cache.shape[2]
    if k_cache.stride(3) != 1 or q_BND.stride(2) != 1 or D & (D - 1):
        raise ValueError(f"paged_decode_triton needs contiguous head_dim (a power of two), got D={D}")
    group = N // K
    bt = block_tables_BM.contiguous()
    sms = num_sms(q_BND.device.index or 0) if q_BND.is_cuda else 4  # (4: the CPU interpreter in the tests)
    if num_splits is None:
        num_splits = decode_splits(B, K, bt.shape[1] * page, sms, block_n)
    members = prefix_members(group)
    psplits = PREFIX_SPLITS if prefix is not None else 0
    slots = num_splits + psplits
    out = torch.empty_like(q_BND)
    if slots > 1:
        part = torch.empty(B, N, slots, D, dtype=torch.float32, device=q_BND.device)
        mx = torch.empty(B, N, slots, dtype=torch.float32, device=q_BND.device)
        sm = torch.empty_like(mx)
        dst, s_op, s_mb, s_mh = part, part.stride(2), mx.stride(0), mx.stride(1)
    else:
        mx = sm = out  # unused by the single-pass kernel
        dst, s_op, s_mb, s_mh = out, 0, 0, 0
    if prefix is None:  # (PL, GS, GN: read only with CASCADE)
        pl = gs = gn = context_lens_B
        ng = 0
    else:
        pl, gs, gn, ng = prefix.lens_B, prefix.first_G, prefix.count_G, prefix.first_G.shape[0]
    _paged_decode_kernel[(ng + B, K, max(num_splits, psplits))](
        q_BND, k_cache, v_cache, dst, mx, sm, bt, context_lens_B, pl, gs, gn, ng, scale * 1.4426950408889634,
        q_BND.stride(0), q_BND.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        bt.stride(0), dst.stride(0), dst.stride(1), s_op, s_mb, s_mh, num_splits, DIRECT=slots == 1, GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), D=D, PAGE=page, BLOCK_N=block_n,
        CASCADE=prefix is not None, MEMBERS=members,
        ROWS_PAD=max(16, triton.next_power_of_2(members * group)), PSPLITS=psplits, MIN_CHUNK=MIN_PREFIX_CHUNK,
        PRECISION="ieee" if q_BND.dtype == torch.float32 else "tf32", num_warps=num_warps, num_stages=num_stages,
    )
    if slots > 1:
        _merge_splits_kernel[(B, N)](part, mx, sm, out, pl, part.stride(0), part.stride(1), part.stride(2),
                                     mx.stride(0), mx.stride(1), out.stride(0), out.stride(1), num_splits,
                                     D=D, PSPLITS=psplits, SLOTS_PAD=triton.next_power_of_2(slots),
                                     BLOCK_N=block_n, MIN_CHUNK=MIN_PREFIX_CHUNK, num_warps=4)
    return out
