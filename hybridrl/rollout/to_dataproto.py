"""Turn generate() outputs + the prompt batch into the rollout DataProto keys of docs/CONTRACTS.md.

Choices: one row per sample with the n samples of a prompt adjacent (the prompt batch is repeated
with interleave, non-tensor entries too); responses are right-padded with pad_token_id to
`response_length`; response position ids continue from the prompt's last position. A response longer
than `response_length` raises ValueError (max_tokens must not exceed it) — nothing is cut silently.
Multi-turn samples (a `response_mask` on the completion): the tool messages stay in `responses` and in the
attention mask (the trainer's forward sees the whole trajectory) but `response_mask` is 0 on them (no loss,
advantage or KL there) and so are their `rollout_log_probs`; each sample's `turn_stats` go to the non-tensor
batch: verl's `__num_turns__` and `tool_call_counts`, and the full counts in `multi_turn_stats`.
Recorded experts (MoE models, `record_routed_experts`) become verl's `routed_experts` [B, prompt + response
columns, MoE layers, k], aligned with `input_ids`: each token's experts at its column, the 'not recorded' id
(moe.not_routed) at padding and at each sample's last token.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.protocol import DataProto
from hybridrl.rollout.sampling_params import RequestOutput


def outputs_to_dataproto(prompts: DataProto, outputs: list[RequestOutput], *, response_length: int,
                         pad_token_id: int) -> DataProto:
    if len(outputs) != len(prompts):
        raise ValueError(f"outputs_to_dataproto: {len(outputs)} request outputs for {len(prompts)} prompts")
    ns = {len(o.outputs) for o in outputs}
    if len(ns) != 1:
        raise ValueError(f"outputs_to_dataproto: every prompt needs the same number of samples, got {sorted(ns)}")
    n = ns.pop()
    samples = [c for o in outputs for c in o.outputs]
    B = len(samples)
    responses = torch.full((B, response_length), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(B, response_length, dtype=torch.long)
    valid = torch.zeros(B, response_length, dtype=torch.long)  # attended: model and appended tokens
    log_probs = torch.zeros(B, response_length, dtype=torch.float32)
    for i, c in enumerate(samples):
        L = len(c.token_ids)
        if L > response_length:
            raise ValueError(f"outputs_to_dataproto: sample {i} has {L} tokens > response_length={response_length}; "
                             "set max_tokens <= response_length")
        responses[i, :L] = torch.tensor(c.token_ids, dtype=torch.long)
        valid[i, :L] = 1
        model = torch.tensor(c.response_mask, dtype=torch.long) if c.response_mask is not None else 1
        response_mask[i, :L] = model
        log_probs[i, :L] = torch.tensor(c.logprobs, dtype=torch.float32) * response_mask[i, :L]
    data = prompts.repeat(n, interleave=True) if n > 1 else prompts
    prompt_ids = data.batch["input_ids"]
    prompt_mask = data.batch["attention_mask"]
    prompt_pos = data.batch["position_ids"]
    delta = torch.arange(1, response_length + 1, dtype=prompt_pos.dtype)
    response_pos = prompt_pos[:, -1:] + delta[None, :]
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], 1),
        "attention_mask": torch.cat([prompt_mask, valid.to(prompt_mask.dtype)], 1),
        "position_ids": torch.cat([prompt_pos, response_pos], 1),
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
    }
    if samples[0].routed_experts is not None:
        tensors["routed_experts"] = _aligned_experts(samples, prompt_mask, response_length)
    others = {k: v for k, v in data.non_tensor_batch.items()}
    if any(c.turn_stats is not None for c in samples):
        stats = [c.turn_stats or {} for c in samples]
        others["__num_turns__"] = np.array([s.get("num_turns", 1) for s in stats], dtype=np.int64)
        others["tool_call_counts"] = np.array([s.get("tool_calls", 0) for s in stats], dtype=np.int64)
        others["multi_turn_stats"] = np.array(stats, dtype=object)
    return DataProto.from_dict(tensors, others, dict(data.meta_info))


def _aligned_experts(samples, prompt_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """The samples' recorded experts at their tokens' columns of input_ids (the prompt's unpadded columns, then the
    response's); everything else holds the record's 'not recorded' id (its dtype's largest value)."""
    first = samples[0].routed_experts
    out = torch.full((len(samples), prompt_mask.shape[1] + response_length, *first.shape[1:]),
                     torch.iinfo(first.dtype).max, dtype=first.dtype)
    for i, c in enumerate(samples):
        cols = torch.cat([prompt_mask[i].nonzero(as_tuple=True)[0],
                          prompt_mask.shape[1] + torch.arange(len(c.token_ids))])
        if c.routed_experts.shape[0] != cols.numel():
            raise ValueError(f"outputs_to_dataproto: sample {i} has experts for {c.routed_experts.shape[0]} tokens, "
                             f"its prompt and response have {cols.numel()}")
        out[i, cols] = c.routed_experts
    return out
