"""Build the rollout engine a worker uses, from the `actor_rollout_ref.rollout` config section.

`native` is our paged-KV engine (TP over the given group; weights arrive from the actor by resharding).
`hf` wraps the actor's own module in HF `generate` — any causal LM, no second copy of the weights, slow; with
FSDP on several ranks every rank runs generate in lockstep (`synced_gpus`), which HF supports for sharded models.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from transformers import AutoConfig, AutoTokenizer


def build_rollout_engine(rcfg: DictConfig, *, model_path: str, device: torch.device, dtype: torch.dtype, tp_group,
                         num_kv_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, async_scheduling: bool,
                         actor_module=None):
    """dtype, num_kv_blocks, max_num_seqs, max_num_batched_tokens: the run plan's engine dtype, KV need for a step's
    batch (on GPUs capped by gpu_memory_utilization at wake), engine concurrency (rollout.max_num_seqs bounded by
    the batch), prefill budget (rollout.max_num_batched_tokens raised to the longest sequence) and whether decode
    steps are launched ahead (rollout.async_scheduling resolved)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    eos = tokenizer.eos_token_id
    if rcfg.name == "hf":
        if tp_group is not None:
            raise ValueError("actor_rollout_ref.rollout.name=hf runs HF generate on each rank: set "
                             "rollout.tensor_model_parallel_size=1")
        from hybridrl.rollout.hf_backend import HFRolloutEngine

        engine = HFRolloutEngine(actor_module, pad_token_id=tokenizer.pad_token_id or 0, eos_token_id=eos,
                                 synced=torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1)
        engine.shares_actor_weights = True  # the hybrid engine must not reshard into (or offload) the actor itself
        return engine
    if rcfg.name != "native":
        raise ValueError(f"actor_rollout_ref.rollout.name={rcfg.name!r}: use 'native' (paged-KV engine) or 'hf'")
    from hybridrl.rollout.engine import LLMEngine

    hf_config = AutoConfig.from_pretrained(model_path)
    max_model_len = int(rcfg.prompt_length) + int(rcfg.response_length)
    return LLMEngine(
        hf_config, tp_group=tp_group, device=device, dtype=dtype,
        block_size=int(rcfg.block_size), gpu_memory_utilization=float(rcfg.gpu_memory_utilization),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len, enforce_eager=bool(rcfg.enforce_eager),
        enable_prefix_sharing=bool(rcfg.enable_prefix_sharing), num_kv_blocks=num_kv_blocks, eos_token_id=eos,
        async_scheduling=async_scheduling)
