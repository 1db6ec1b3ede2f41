"""`hf` rollout backend: HF `generate` behind the native engine's generate() signature.

For architectures the native engine does not support, and as the benchmark baseline.
Choices: prompts are left-padded into one batch and each is repeated n times (samples adjacent);
log-probs are log_softmax(logits / temperature) of the sampled token (raw logits when greedy),
computed from `output_logits` so they match the native engine and the actor. A completion stops at
its first eos / stop token (kept, finish_reason 'stop'); HF's padding after it is dropped. The
wake/sleep/load_weights methods keep the engine lifecycle: weights are copied in by HF name.
"""

from __future__ import annotations

import torch

from hybridrl.rollout.config import token_ids
from hybridrl.rollout.sampling_params import CompletionOutput, RequestOutput, SamplingParams


class HFRolloutEngine:
    def __init__(self, model, *, pad_token_id: int = 0, eos_token_id=None, synced: bool = False):
        # synced: the model is FSDP-sharded over several ranks, whose forwards are collectives; HF's
        # synced_gpus keeps every rank stepping until all are done, so unequal lengths cannot deadlock
        self.model = model
        self.synced = synced
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(token_ids(model.config.eos_token_id if eos_token_id is None else eos_token_id))
        self.stats = {"generated_tokens": 0}

    def wake_up(self, tags=("weights", "kv_cache"), num_kv_blocks=None) -> None:
        return None

    def sleep(self, level: int = 1, clear_workspaces: bool = True) -> None:
        return None

    def weight_shard_spec(self, hf_name, full_shape):
        return None

    @torch.no_grad()
    def load_weights(self, weights) -> int:
        params = dict(self.model.named_parameters())
        count = 0
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"load_weights: unknown weight name {name!r} for the hf rollout backend")
            params[name].copy_(tensor)
            count += 1
        return count

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], sampling_params: SamplingParams) -> list[RequestOutput]:
        p = sampling_params
        self.stats = {"generated_tokens": 0}   # like the native engine's, the stats of the last call
        device = next(self.model.parameters()).device
        rows = [prompt for prompt in prompt_token_ids for _ in range(p.n)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        stops = [] if p.ignore_eos else list(self.eos_token_ids)
        stops += p.stop_token_ids
        if p.seed is not None:
            torch.manual_seed(p.seed)
        kwargs = dict(do_sample=not p.greedy, max_new_tokens=p.max_tokens, eos_token_id=stops or None,
                      pad_token_id=self.pad_token_id, output_logits=True, return_dict_in_generate=True,
                      synced_gpus=self.synced)
        if not p.greedy:
            kwargs.update(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else 0)
        out = self.model.generate(ids.to(device), attention_mask=mask.to(device), **kwargs)
        gen = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, 1).float().cpu()  # [rows, steps, V]
        temp = 1.0 if p.greedy else p.temperature
        logp = torch.log_softmax(logits / temp, -1).gather(2, gen[:, :, None]).squeeze(2)
        results = []
        for rid, prompt in enumerate(prompt_token_ids):
            outs = []
            for j in range(p.n):
                row = rid * p.n + j
                toks = gen[row].tolist()
                end = next((i + 1 for i, t in enumerate(toks) if t in stops), None)
                reason = "stop" if end is not None else "length"
                end = end or len(toks)
                outs.append(CompletionOutput(j, toks[:end], logp[row, :end].tolist(), reason))
                self.stats["generated_tokens"] += end
            results.append(RequestOutput(rid, list(prompt), outs))
        return results
