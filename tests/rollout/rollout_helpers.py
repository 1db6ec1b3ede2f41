"""Tiny random HF models for the rollout tests (no downloads)."""

import torch
import transformers

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)


def tiny_config(kind: str, **overrides):
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**TINY)
    elif kind == "llama":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32, "rope_theta": 10000.0}
        cfg = transformers.LlamaConfig(**TINY, rope_scaling=rope)
    elif kind == "mistral":  # head_dim set apart from hidden / heads, as in Mistral-Nemo
        cfg = transformers.MistralConfig(**TINY, head_dim=24, sliding_window=None, rope_theta=1e6)
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(**TINY, head_dim=32)
    elif kind == "qwen3_moe":  # 3 layers: MoE, dense (mlp_only_layers), MoE
        cfg = transformers.Qwen3MoeConfig(**{**TINY, "num_hidden_layers": 3}, head_dim=32, num_experts=8,
                                          num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                                          mlp_only_layers=[1])
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**{**TINY, "intermediate_size": 48}, num_local_experts=4,
                                         num_experts_per_tok=2, rope_theta=10000.0)
    else:
        raise KeyError(kind)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def tiny_hf_model(kind: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = tiny_config(kind, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():  # larger random weights so greedy paths are not all the same token
        for p in model.parameters():
            if p.dim() >= 2:  # 3-D: the fused experts of MoE models
                p.normal_(0, 0.2)
    return model


def make_engine(model, **kw):
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine

    args = dict(dtype=torch.float32, block_size=4, num_kv_blocks=256, max_num_seqs=64, max_num_batched_tokens=256,
                enforce_eager=True)
    args.update(kw)
    engine = LLMEngine(model.config, EngineConfig(**args), device="cpu")
    engine.wake_up(("weights",))
    engine.load_weights(model.state_dict().items())
    engine.wake_up(("kv_cache",))
    return engine


def hf_greedy(model, prompt, max_new_tokens):
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_logprobs(model, prompt, response, temperature=1.0):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(1, torch.tensor(response)[:, None]).squeeze(1)
