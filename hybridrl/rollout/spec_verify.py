"""Exact acceptance of draft tokens (speculative decoding with a point-mass draft): the tokens a sequence emits in a
verify step are distributed exactly as plain decoding would sample them.

Choices:
- A sequence with drafts d_1..d_k has k + 1 logits rows: row j is the target distribution p_j of the token after
  d_1..d_j (row 0: after its last token). p_j is what the sampler samples from (sampler.scale and
  sampler.truncate: temperature, then top-k / top-p, softmax). The draft is a point mass q = δ(d), so the
  speculative-sampling rule min(1, p/q) accepts d_{j+1} with probability p_j(d_{j+1}) (uniform u < p); the first
  rejected one is replaced by a sample of the residual max(p_j - q, 0), i.e. p_j without d_{j+1}, renormalised,
  and the sequence stops there; when all k are accepted a bonus token is sampled from p_k. Greedy rows
  (temperature 0) accept while argmax equals the draft and emit the argmax at the first mismatch (or as the
  bonus): the same rule with p = δ(argmax), which is plain greedy decoding token for token.
- Each emitted token's log-prob is log_softmax(logits / temperature) of its row over the full vocabulary (raw
  log_softmax for greedy), exactly what the sampler returns and the actor recomputes.
- All on the device, one read: the uniforms come first (one per row), then one exponential-race noise row per
  sequence from the caller's generator (TP ranks draw the same and agree without a broadcast). Outputs are
  [B, max k + 1] padded with -1 after each sequence's last emitted token.

Shape legend: R logits rows (sum of k + 1), B sequences, J = max k + 1, V vocab.
"""

from __future__ import annotations

import itertools

import torch

from hybridrl.rollout.sampler import scale, truncate


def verify_drafts(logits_RV, drafts: list[list[int]], temperature_R, top_k_R, top_p_R, generator=None,
                  flags=None):
    """-> (tokens [B, J] int64, log-probs [B, J] fp32), each row the sequence's accepted drafts and one sampled
    token, then -1. `flags` = (all_greedy, use_top_k, use_top_p) as for sampler.sample (None: read from the
    tensors)."""
    dev = logits_RV.device
    R, V = logits_RV.shape
    counts = [len(d) for d in drafts]
    if R != sum(counts) + len(drafts):
        raise ValueError(f"verify_drafts: {R} logits rows for drafts of lengths {counts} (need one row more than "
                         "drafts per sequence)")
    greedy_R = temperature_R <= 0
    if flags is None:
        flags = (bool(greedy_R.all()), bool(((top_k_R > 0) & (top_k_R < V)).any()), bool((top_p_R < 1).any()))
    all_greedy, use_k, use_p = flags
    J = max(counts) + 1
    starts = list(itertools.accumulate((k + 1 for k in counts[:-1]), initial=0))
    # host-built indices, one copy: the draft each row checks (-1 on a sequence's last row), and row of (b, j)
    # (j past a sequence's last row repeats it; such entries are masked)
    draft_R = torch.tensor([t for d in drafts for t in (*d, -1)], device=dev)
    row_BJ = torch.tensor([[s + min(j, k) for j in range(J)] for s, k in zip(starts, counts)], device=dev)
    count_B = torch.tensor(counts, device=dev)
    j_J = torch.arange(J, device=dev)

    scaled = scale(logits_RV, temperature_R)
    logp_RV = torch.log_softmax(scaled, dim=-1)
    argmax_R = logits_RV.argmax(dim=-1)
    ok_R = argmax_R == draft_R
    if not all_greedy:
        probs_RV = truncate(scaled, top_k_R, top_p_R, use_k, use_p).softmax(-1)
        u_R = torch.rand(R, device=dev, generator=generator)
        p_draft_R = probs_RV.gather(1, draft_R.clamp(min=0)[:, None]).squeeze(1)
        ok_R = torch.where(greedy_R, ok_R, u_R < p_draft_R)
    ok_BJ = ok_R[row_BJ] & (j_J[None, :] < count_B[:, None])
    accepted_B = ok_BJ.long().cumprod(1).sum(1)
    final_B = row_BJ.gather(1, accepted_B[:, None]).squeeze(1)   # the row of the token sampled last
    last_B = argmax_R[final_B]
    if not all_greedy:
        rejected_B = draft_R[final_B]                               # -1 when every draft was accepted
        residual = probs_RV[final_B]
        b = torch.arange(len(drafts), device=dev)
        col = rejected_B.clamp(min=0)
        residual[b, col] = torch.where(rejected_B >= 0, 0.0, residual[b, col])
        race = torch.empty_like(residual).exponential_(1.0, generator=generator)
        last_B = torch.where(greedy_R[final_B], last_B, (residual / race).argmax(dim=-1))
    draft_BJ = draft_R[row_BJ]
    acc = accepted_B[:, None]
    tokens_BJ = torch.where(j_J[None, :] < acc, draft_BJ, torch.where(j_J[None, :] == acc, last_B[:, None], -1))
    logprobs_BJ = logp_RV[row_BJ, tokens_BJ.clamp(min=0)].masked_fill(tokens_BJ < 0, 0.0)
    return tokens_BJ, logprobs_BJ
