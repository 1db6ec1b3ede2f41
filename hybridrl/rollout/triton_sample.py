"""Triton sampler kernel: one pass over each logits row for plain (temperature / greedy) sampling.

Choices (the torch sampler makes ~12 full [B, V] fp32 passes — cast, divide, log_softmax, softmax,
divide by the noise, two argmaxes — about 1 ms a step at B=256, V=152k):
- One program per row streams the row's logits (model dtype, any row stride) and its Exp(1) noise
  once, keeping an online logsumexp of logits/T and a running argmax of logits/T - log(E). Since
  argmax(p / E) = argmax(log p - log E) = argmax(logits/T - log E), that is the same exponential-race
  sample as the torch sampler's, from the same noise tensor drawn with the caller's generator (same seed,
  same tokens across TP ranks), without ever normalising the distribution.
- Greedy rows (temperature <= 0) take argmax(logits) (first index on ties, like torch.argmax) and
  the raw log_softmax; sampled rows get log_softmax(logits/T)[token] over the full vocabulary, as
  the sampler module's docstring defines.
- Only for rows without top-k/top-p; the caller (sampler.sample) falls back to torch otherwise.
- With few rows (the tail of a rollout) one program per row would stream 152k logits alone while the other SMs
  idle: the vocabulary is then split into `vocab_splits` chunks, one program each, which store their chunk's
  max, rescaled sum and best race key; a second kernel merges them per row (logsumexp of the parts; the first
  chunk holding the largest key wins ties, as torch.argmax's first index does). The chunk and split counts are
  runtime arguments Triton does not specialise on, so two compiled kernels (one chunk or several: SPLIT) serve
  every batch size.

Shape legend: B rows, V vocab.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# the merge's tile of parts: one warp's lanes, more than vocab_splits gives a 152k vocabulary (18); fixed, so one
# compiled merge serves every batch size
MERGE_PAD = 32


@triton.jit(do_not_specialize=["CHUNK", "SPLITS"])
def _sample_kernel(L, E, T, TOK, LP, PM, PS, PB, PI, s_l, s_e, CHUNK, SPLITS, SPLIT: tl.constexpr, V: tl.constexpr,
                   BLOCK: tl.constexpr, HAS_NOISE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    temp = tl.load(T + row).to(tl.float32)
    greedy = temp <= 0
    t = tl.where(greedy, 1.0, temp)
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    best = m
    best_i = tl.sum(tl.zeros([BLOCK], tl.int64), 0)
    lo = part * CHUNK
    for start in range(lo, tl.minimum(lo + CHUNK, V), BLOCK):
        idx = start + cols
        mask = idx < V
        z = tl.load(L + row * s_l + idx, mask=mask, other=float("-inf")).to(tl.float32) / t
        m_new = tl.maximum(m, tl.max(z, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        m = m_new
        if HAS_NOISE:
            e = tl.load(E + row * s_e + idx, mask=mask, other=1.0)
            key = tl.where(greedy, z, z - tl.log(e))
        else:
            key = z
        key = tl.where(mask, key, float("-inf"))
        cb = tl.max(key, 0)
        ci = tl.argmax(key, 0)
        take = cb > best
        best_i = tl.where(take, start + ci, best_i)
        best = tl.maximum(best, cb)
    if not SPLIT:  # one chunk: this program's token and log-prob are the row's
        zt = tl.load(L + row * s_l + best_i).to(tl.float32) / t
        tl.store(TOK + row, best_i)
        tl.store(LP + row, zt - (m + tl.log(s)))
    else:
        tl.store(PM + row * SPLITS + part, m)
        tl.store(PS + row * SPLITS + part, s)
        tl.store(PB + row * SPLITS + part, best)
        tl.store(PI + row * SPLITS + part, best_i)


@triton.jit(do_not_specialize=["SPLITS"])
def _merge_kernel(L, T, TOK, LP, PM, PS, PB, PI, s_l, SPLITS, SPLITS_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(T + row).to(tl.float32)
    t = tl.where(temp <= 0, 1.0, temp)
    p = tl.arange(0, SPLITS_PAD)
    live = p < SPLITS
    m = tl.load(PM + row * SPLITS + p, mask=live, other=float("-inf"))
    s = tl.load(PS + row * SPLITS + p, mask=live, other=0.0)
    key = tl.load(PB + row * SPLITS + p, mask=live, other=float("-inf"))
    m_all = tl.max(m, 0)
    lse = m_all + tl.log(tl.sum(s * tl.exp(m - m_all), 0))
    best_i = tl.load(PI + row * SPLITS + tl.argmax(key, 0))
    zt = tl.load(L + row * s_l + best_i).to(tl.float32) / t
    tl.store(TOK + row, best_i)
    tl.store(LP + row, zt - lse)


def vocab_splits(rows: int, vocab: int, num_sms: int, min_chunk: int = 8192) -> int:
    """Vocabulary chunks per row: enough programs to fill every SM about twice, each chunk at least min_chunk."""
    want = -(-2 * num_sms // max(1, rows))
    return int(max(1, min(want, vocab // min_chunk)))


def sample_plain(logits_BV, temperature_B, generator=None, all_greedy: bool = False, block: int = 2048,
                 splits: int | None = None):
    """-> (tokens [B] int64, log-probs [B] fp32) for rows without top-k/top-p. splits: vocabulary chunks per row
    (None: vocab_splits for this batch on this GPU)."""
    B, V = logits_BV.shape
    if logits_BV.stride(1) != 1:
        logits_BV = logits_BV.contiguous()
    if all_greedy:  # no noise drawn (the torch sampler draws none either)
        noise = logits_BV
    else:
        noise = torch.empty(B, V, dtype=torch.float32, device=logits_BV.device).exponential_(1.0,
                                                                                              generator=generator)
    tokens = torch.empty(B, dtype=torch.int64, device=logits_BV.device)
    logprobs = torch.empty(B, dtype=torch.float32, device=logits_BV.device)
    if not B:
        return tokens, logprobs
    if splits is None:
        from hybridrl.rollout.triton_decode import num_sms

        splits = vocab_splits(B, V, num_sms(logits_BV.device.index or 0))
    chunk = -(-V // splits)
    chunk = -(-chunk // block) * block
    splits = -(-V // chunk)
    temp = temperature_B.float().contiguous()
    parts = [torch.empty(B * splits, dtype=dt, device=logits_BV.device)
             for dt in (torch.float32, torch.float32, torch.float32, torch.int64)] if splits > 1 else [tokens] * 4
    _sample_kernel[(B, splits)](logits_BV, noise, temp, tokens, logprobs, *parts, logits_BV.stride(0),
                                noise.stride(0), chunk, splits, SPLIT=splits > 1, V=V, BLOCK=block,
                                HAS_NOISE=not all_greedy, num_warps=8)
    if splits > 1:
        _merge_kernel[(B,)](logits_BV, temp, tokens, logprobs, *parts, logits_BV.stride(0), splits,
                            SPLITS_PAD=max(MERGE_PAD, triton.next_power_of_2(splits)), num_warps=1)
    return tokens, logprobs
