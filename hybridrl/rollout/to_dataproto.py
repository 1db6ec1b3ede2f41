"""Turn generate() outputs + the prompt batch into the rollout DataProto keys of docs/CONTRACTS.md.

Choices: one row per sample with the samples of a prompt adjacent (each prompt row repeated once per sample, non-tensor
entries too: n, or more where an agent loop forked branches — they carry the prompt's uid, so GRPO groups them); responses are right-padded with pad_token_id to
`response_length`; response position ids continue from the prompt's last position. A response longer
than `response_length` raises ValueError (max_tokens must not exceed it) — nothing is cut silently.
Multi-turn samples (a `response_mask` on the completion): the tool messages stay in `responses` and in the
attention mask (the trainer's forward sees the whole trajectory) but `response_mask` is 0 on them (no loss,
advantage or KL there) and so are their `rollout_log_probs`; each sample's `turn_stats` go to the non-tensor
batch: verl's `__num_turns__` and `tool_call_counts`, and the full counts in `multi_turn_stats`; an agent loop's
rewards (a number or None per sample) in `agent_reward`, which the reward manager uses instead of scoring.
Partial rollouts (trainer/partial_rollout.py) send one row per sample with the tokens it carries (`CARRIED_KEYS`,
empty for a fresh sample): `sample_requests` makes the engine's requests of them — n adjacent fresh rows of one
uid are one prompt's n samples (sharing its KV), every other row a continuation — and `completions_to_dataproto`
returns each row's whole completion so far (carried and new tokens, log-probs, finish reason) in row order.
Recorded experts (MoE models, `record_routed_experts`) become verl's `routed_experts` [B, prompt + response
columns, MoE layers, k], aligned with `input_ids`: each token's experts at its column, the 'not recorded' id
(moe.not_routed) at padding and at each sample's last token.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.protocol import DataProto
from hybridrl.rollout.sampling_params import CompletionOutput, Continuation, RequestOutput

CARRIED_KEYS = ("carried_ids", "carried_log_probs")   # a partial rollout's sample rows: tokens so far, log-probs


def outputs_to_dataproto(prompts: DataProto, outputs: list[RequestOutput], *, response_length: int,
                         pad_token_id: int) -> DataProto:
    if len(outputs) != len(prompts):
        raise ValueError(f"outputs_to_dataproto: {len(outputs)} request outputs for {len(prompts)} prompts")
    counts = [len(o.outputs) for o in outputs]
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
    data = prompts.select_idxs(torch.arange(len(prompts)).repeat_interleave(torch.tensor(counts)))
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
        if any(s.get("reward") is not None for s in stats):
            others["agent_reward"] = np.array([s.get("reward") for s in stats], dtype=object)
    return DataProto.from_dict(tensors, others, dict(data.meta_info))


def sample_requests(prompts: list[list[int]], samples: DataProto, n: int
                    ) -> tuple[list[list[int]], list[Continuation], list[int]]:
    """(the fresh prompts, the continuations, each request's first row) of sample rows whose unpadded prompts are
    `prompts`. A fresh group cut by the dispatch (fewer than n adjacent rows) becomes continuations without
    tokens: the same samples, only without the shared prompt KV."""
    ids, log_probs = (samples.non_tensor_batch[k] for k in CARRIED_KEYS)
    uids = samples.non_tensor_batch["uid"]
    fresh, conts, fresh_rows, cont_rows = [], [], [], []
    i = 0
    while i < len(samples):
        group = range(i, i + n)
        if i + n <= len(samples) and all(len(ids[j]) == 0 and uids[j] == uids[i] for j in group):
            fresh.append(prompts[i])
            fresh_rows.append(i)
            i += n
            continue
        conts.append(Continuation(prompts[i], list(ids[i]), list(log_probs[i])))
        cont_rows.append(i)
        i += 1
    return fresh, conts, fresh_rows + cont_rows


def completions_to_dataproto(outputs: list[RequestOutput], first_rows: list[int], num_rows: int) -> DataProto:
    """Each sample row's completion (`token_ids`, `log_probs`, `finish_reason`, non-tensor), in row order:
    request r's samples fill the rows from first_rows[r] on."""
    by_row: list[CompletionOutput | None] = [None] * num_rows
    for out, row in zip(outputs, first_rows, strict=True):
        for j, c in enumerate(out.outputs):
            by_row[row + j] = c
    if any(c is None for c in by_row):
        raise ValueError(f"completions_to_dataproto: {by_row.count(None)} of {num_rows} rows got no completion")
    return DataProto.from_dict(non_tensors={"token_ids": [c.token_ids for c in by_row],
                                            "log_probs": [c.logprobs for c in by_row],
                                            "finish_reason": [c.finish_reason for c in by_row]})


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
