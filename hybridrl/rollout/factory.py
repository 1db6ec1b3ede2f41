"""Build the rollout engine a worker uses, from the `actor_rollout_ref.rollout` config section and the run plan.

`native` is our paged-KV engine (TP over the given group; weights arrive from the actor by resharding), configured
by the plan's `EngineConfig` (rollout/config.py) — the factory adds only what the plan cannot know, the stop tokens;
it runs the actor's HF config (overrides applied).
`hf` wraps the actor's own module in HF `generate` — any causal LM, no second copy of the weights, slow; with
FSDP on several ranks every rank runs generate in lockstep (`synced_gpus`), which HF supports for sharded models.
"""

from __future__ import annotations

import os

import torch


def stop_token_ids(model_path: str, tokenizer) -> tuple[int, ...]:
    """The tokens that end a sequence: the tokenizer's eos, then the other eos ids of the model's
    generation_config.json (an instruct model lists its turn end and its document end there, Llama 3.1 also its
    tool-call end), as vLLM stops on them."""
    from transformers import GenerationConfig

    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    try:
        listed = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:   # no generation_config.json
        listed = None
    for token in [listed] if isinstance(listed, int) else list(listed or ()):
        if int(token) not in ids:
            ids.append(int(token))
    return tuple(ids)


def build_rollout_engine(config, plan, *, device: torch.device, tp_group, actor_module=None):
    """The engine `actor_rollout_ref.rollout.name` names. The native one runs the actor's HF config
    (`model.override_config` applied, as the actor's model has it), configured by `plan.rollout.engine_config` (the
    run plan's sizes, dtype and scheduling with the section's switches), ending sequences at `stop_token_ids` of the
    run's tokenizer (`models/tokenizer.py: policy_tokenizer`) and the model's generation config."""
    from hybridrl.models.tokenizer import policy_tokenizer
    from hybridrl.training.fsdp import load_hf_config

    rcfg, model = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    model_path = os.path.expanduser(model.path)
    tokenizer = policy_tokenizer(config)
    eos = stop_token_ids(model_path, tokenizer)
    if rcfg.name == "hf":
        if tp_group is not None:
            raise ValueError("actor_rollout_ref.rollout.name=hf runs HF generate on each rank: set "
                             "rollout.tensor_model_parallel_size=1")
        from hybridrl.rollout.hf_backend import HFRolloutEngine

        engine = HFRolloutEngine(actor_module, pad_token_id=tokenizer.pad_token_id or 0, eos_token_id=list(eos) or None,
                                 synced=torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1)
        engine.shares_actor_weights = True  # the hybrid engine must not reshard into (or offload) the actor itself
        return engine
    if rcfg.name != "native":
        raise ValueError(f"actor_rollout_ref.rollout.name={rcfg.name!r}: use 'native' (paged-KV engine) or 'hf'")
    from hybridrl.rollout.engine import LLMEngine

    hf_config = load_hf_config(model_path, override_config=model.override_config,
                               trust_remote_code=model.trust_remote_code)
    engine_config = plan.rollout.engine_config(rcfg, eos_token_ids=eos or None)
    return LLMEngine(hf_config, engine_config, tp_group=tp_group, device=device)
