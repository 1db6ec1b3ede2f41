"""Attention over a paged KV cache: the context object the decoder calls, prefill and decode paths.

Choices:
- `AttentionContext` carries the step's metadata and the per-layer caches explicitly (no global
  context); the decoder only calls `ctx.attend(layer, q, k, v, scale)`.
- Cache layout per layer: [2, num_blocks, block_size, kv_heads_local, head_dim]; K/V of the step's
  tokens are written with `index_copy_` at `slot_mapping` (block * block_size + offset).
- Prefill of fresh sequences of one length: SDPA (causal, enable_gqa) straight on the step's q/k/v, one
  batched call. Any other prefill (lengths that differ, or sequences with cached tokens: a turn resumed after
  its tool message, a carried sample, a re-admitted one) on CUDA in 16-bit: FlashAttention varlen, one call per
  layer for a run of sequences (`prefill_chunks`, made by the runner), its keys gathered from the cache by slot
  (the cache already holds the step's K/V) and the causal mask aligned to each key segment's end, which is the
  offset-causal mask of a sequence with cached tokens. Elsewhere (CPU, fp32; also the reference) one SDPA call
  per sequence, with an explicit offset-causal mask over the gathered K/V where tokens are cached: on a GPU that
  loop cost ~8 kernels per sequence and layer, which made multi-turn rollouts (hundreds of resumed turns per
  step) several times slower than single-turn.
- The context also carries the optional routing record of MoE models ([MoE layers, slots, k] expert ids): MoE
  blocks write their tokens' experts at the same `slot_mapping` as the K/V (`record_experts`), inside CUDA graphs
  too.
- Decode: on CUDA the Triton paged kernel (reads each K/V block once per kv head, GQA in one
  program), with `shared_prefix` set (cascade) reading the prefix a group of rows shares once for the group;
  elsewhere `paged_decode_reference`, a plain torch gather + softmax in fp32, which is
  also the oracle the kernel is tested against.

Shape legend: T tokens, B sequences, N q heads, K kv heads, D head_dim, M blocks per sequence, S keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hybridrl.models.varlen_attention import varlen_causal_attention
from hybridrl.rollout.shared_prefix import SharedPrefix


def sdpa_gqa(q_BNLD, k_BKSD, v_BKSD, scale, is_causal=False, mask=None):
    if q_BNLD.shape[1] != k_BKSD.shape[1]:
        try:
            return F.scaled_dot_product_attention(q_BNLD, k_BKSD, v_BKSD, attn_mask=mask, is_causal=is_causal,
                                                  scale=scale, enable_gqa=True)
        except TypeError:  # torch without enable_gqa
            rep = q_BNLD.shape[1] // k_BKSD.shape[1]
            k_BKSD, v_BKSD = k_BKSD.repeat_interleave(rep, 1), v_BKSD.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q_BNLD, k_BKSD, v_BKSD, attn_mask=mask, is_causal=is_causal, scale=scale)


def paged_decode_reference(q_BND, k_cache, v_cache, block_tables_BM, context_lens_B, scale):
    """Torch reference: one query token per sequence against its paged context."""
    B, N, D = q_BND.shape
    bs, K = k_cache.shape[1], k_cache.shape[2]
    M = block_tables_BM.shape[1]
    k_BSKD = k_cache[block_tables_BM.long()].reshape(B, M * bs, K, D).float()
    v_BSKD = v_cache[block_tables_BM.long()].reshape(B, M * bs, K, D).float()
    q_BKGD = q_BND.float().view(B, K, N // K, D)
    scores = torch.einsum("bkgd,bskd->bkgs", q_BKGD, k_BSKD) * scale
    invalid_BS = torch.arange(M * bs, device=q_BND.device)[None, :] >= context_lens_B[:, None]
    scores = scores.masked_fill(invalid_BS[:, None, None, :], float("-inf"))
    v_BSKD = v_BSKD.masked_fill(invalid_BS[:, :, None, None], 0.0)
    out = torch.einsum("bkgs,bskd->bkgd", scores.softmax(-1), v_BSKD)
    return out.reshape(B, N, D).to(q_BND.dtype)


@dataclass
class PrefillChunk:
    """Consecutive sequences of a prefill step attended in one FlashAttention varlen call: their new tokens are
    rows [q_lo, q_hi) of the step (query segments `cu_q`); `key_slots` lists each sequence's keys, cached then new,
    as cache slots (key segments `cu_k`)."""
    q_lo: int
    q_hi: int
    cu_q: torch.Tensor       # [S+1] int32
    cu_k: torch.Tensor       # [S+1] int32
    max_q: int
    max_k: int
    key_slots: torch.Tensor  # [sum of key lengths] int64


def prefill_chunks(lens: list[int], cached: list[int], key_slots: list[np.ndarray], cap: int, device
                   ) -> list[PrefillChunk]:
    """A prefill step's sequences (new tokens `lens`, cached tokens `cached`, every position's cache slot
    `key_slots`) in runs whose keys stay within `cap` tokens (the step's token budget: what one varlen call gathers
    stays the size of a full prefill step's K/V), one sequence at least per run."""
    def dev(x, dtype):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=dtype)).to(device, non_blocking=True)

    chunks, i, q_lo = [], 0, 0
    while i < len(lens):
        j, keys = i + 1, cached[i] + lens[i]
        while j < len(lens) and keys + cached[j] + lens[j] <= cap:
            keys, j = keys + cached[j] + lens[j], j + 1
        q = np.asarray(lens[i:j], dtype=np.int64)
        k = q + np.asarray(cached[i:j], dtype=np.int64)
        chunks.append(PrefillChunk(q_lo, q_lo + int(q.sum()), dev(np.concatenate([[0], np.cumsum(q)]), np.int32),
                                   dev(np.concatenate([[0], np.cumsum(k)]), np.int32), int(q.max()), int(k.max()),
                                   dev(np.concatenate(key_slots[i:j]), np.int64)))
        q_lo, i = q_lo + int(q.sum()), j
    return chunks


@dataclass
class AttentionContext:
    kv_caches: list  # per layer [2, num_blocks, block_size, K, D]
    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] int64
    # prefill
    seq_lens: list[int] | None = None  # new tokens per sequence
    cached_lens: list[int] | None = None
    prefill_block_tables: list[torch.Tensor] | None = None  # the per-sequence path, where some cached_lens > 0
    prefill_chunks: list[PrefillChunk] | None = None  # the varlen path (CUDA, 16-bit), set by the runner
    # decode
    block_tables: torch.Tensor | None = None  # [B, M] int32
    context_lens: torch.Tensor | None = None  # [B] int32
    use_triton: bool = False
    shared_prefix: SharedPrefix | None = None  # cascade decode (rollout/shared_prefix.py), Triton path only
    routed_experts: torch.Tensor | None = None  # [MoE layers, slots, k]: the routing record, or None (not recorded)

    def record_experts(self, moe_layer: int, ids_Tk) -> None:
        if self.routed_experts is not None:
            record = self.routed_experts[moe_layer]
            record.index_copy_(0, self.slot_mapping, ids_Tk.to(record.dtype))

    def attend(self, layer: int, q_TND, k_TKD, v_TKD, scale, rope=None):
        """rope=(cos_TD, sin_TD): q/k are not rotated yet; one fused kernel rotates them in place and
        stores K/V (models/fused.py). Else q/k are rotated and K/V are stored with two index_copy_."""
        cache = self.kv_caches[layer]
        K, D = k_TKD.shape[1:]
        if rope is not None:
            from hybridrl.models.fused import rope_store_kv

            rope_store_kv(q_TND, k_TKD, v_TKD, rope[0], rope[1], cache[0], cache[1], self.slot_mapping)
        else:
            cache[0].view(-1, K, D).index_copy_(0, self.slot_mapping, k_TKD)
            cache[1].view(-1, K, D).index_copy_(0, self.slot_mapping, v_TKD)
        if not self.is_prefill:
            if self.use_triton:
                from hybridrl.rollout.triton_decode import paged_decode_triton

                return paged_decode_triton(q_TND, cache[0], cache[1], self.block_tables, self.context_lens, scale,
                                           prefix=self.shared_prefix)
            return paged_decode_reference(q_TND, cache[0], cache[1], self.block_tables, self.context_lens, scale)
        return self._prefill(cache, q_TND, k_TKD, v_TKD, scale)

    def _prefill(self, cache, q_TND, k_TKD, v_TKD, scale):
        lens, cached = self.seq_lens, self.cached_lens
        if self.prefill_chunks is not None:
            return self._prefill_varlen(cache, q_TND, scale)
        if not any(cached) and len(set(lens)) == 1:
            B, L = len(lens), lens[0]
            q, k, v = (x.view(B, L, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q_TND, k_TKD, v_TKD))
            return sdpa_gqa(q, k, v, scale, is_causal=True).transpose(1, 2).reshape(q_TND.shape)
        outs, start = [], 0
        for i, (n, c) in enumerate(zip(lens, cached)):
            q = q_TND[start:start + n].transpose(0, 1).unsqueeze(0)
            if c == 0:
                k = k_TKD[start:start + n].transpose(0, 1).unsqueeze(0)
                v = v_TKD[start:start + n].transpose(0, 1).unsqueeze(0)
                o = sdpa_gqa(q, k, v, scale, is_causal=True)
            else:
                blocks = self.prefill_block_tables[i].long()
                K, D = k_TKD.shape[1:]
                k = cache[0][blocks].reshape(-1, K, D)[: c + n].transpose(0, 1).unsqueeze(0)
                v = cache[1][blocks].reshape(-1, K, D)[: c + n].transpose(0, 1).unsqueeze(0)
                key_pos = torch.arange(c + n, device=q.device)
                mask = key_pos[None, :] <= (c + torch.arange(n, device=q.device))[:, None]
                o = sdpa_gqa(q, k, v, scale, mask=mask)
            outs.append(o.squeeze(0).transpose(0, 1))
            start += n
        return torch.cat(outs, 0)

    def _prefill_varlen(self, cache, q_TND, scale):
        K, D = cache.shape[-2:]
        keys, values = cache[0].view(-1, K, D), cache[1].view(-1, K, D)
        outs = [varlen_causal_attention(q_TND[c.q_lo:c.q_hi], keys.index_select(0, c.key_slots),
                                        values.index_select(0, c.key_slots), c.cu_q, c.cu_k, c.max_q, c.max_k, scale)
                for c in self.prefill_chunks]
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)
