"""Turn generate() outputs + the prompt batch into the rollout DataProto keys of docs/CONTRACTS.md.

Choices: one row per sample with the n samples of a prompt adjacent (the prompt batch is repeated
with interleave, non-tensor entries too); responses are right-padded with pad_token_id to
`response_length`; response position ids continue from the prompt's last position. A response longer
than `response_length` raises ValueError (max_tokens must not exceed it) — nothing is cut silently.
"""

from __future__ import annotations

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
    log_probs = torch.zeros(B, response_length, dtype=torch.float32)
    for i, c in enumerate(samples):
        L = len(c.token_ids)
        if L > response_length:
            raise ValueError(f"outputs_to_dataproto: sample {i} has {L} tokens > response_length={response_length}; "
                             "set max_tokens <= response_length")
        responses[i, :L] = torch.tensor(c.token_ids, dtype=torch.long)
        response_mask[i, :L] = 1
        log_probs[i, :L] = torch.tensor(c.logprobs, dtype=torch.float32)
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
        "attention_mask": torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], 1),
        "position_ids": torch.cat([prompt_pos, response_pos], 1),
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
    }
    others = {k: v for k, v in data.non_tensor_batch.items()}
    return DataProto.from_dict(tensors, others, dict(data.meta_info))
