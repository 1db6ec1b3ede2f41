"""Offline model assets: tiny random HF models for tests, real-shaped random models for GPU benchmarks.

Choices:
- Models come from the real HF config classes (Qwen2, Llama, Qwen3, and Qwen3-MoE for `make_config` and the size
  presets; `build_tiny_model` builds the dense ones, ARCHS), so the code under test loads them through
  `AutoModelForCausalLM.from_pretrained` exactly like a downloaded checkpoint; no hub access is needed.
- The tiny model is initialised by HF's own `_init_weights` under `torch.manual_seed(seed)` (deterministic), in
  fp32, and saved with `save_pretrained` (config.json, model.safetensors, generation_config.json). Its vocab
  is the tokenizer's size rounded up to a multiple of 64 (ids always < vocab_size, embedding rows aligned).
- Size presets keep the published shapes (hidden, layers, heads, kv heads, intermediate, vocab, rope theta,
  tied embeddings; for MoE also experts, experts per token, expert intermediate, head_dim). Their weights are
  never a full model in memory: tensor shapes come from a meta-device model, the ~2 GB safetensors shards are
  planned from those shapes, and each shard's random bf16 tensors (normal(0, initializer_range), ones for
  norms, zeros for biases) are generated — on CUDA when there is one — and written before the next shard's
  are made, so host memory peaks at about one shard (plus one tensor's fp32 draw). `weights=False` writes only
  config + tokenizer (a benchmark may initialise on the GPU instead).
- The tiny reward model is the same backbone as a `...ForSequenceClassification` with num_labels=1.
- Every model directory also holds the tiny tokenizer (see tokenizer.py) and a generation_config with
  eos = <|im_end|> and <|endoftext|>, pad = <|pad|>.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from hybridrl.assets.tokenizer import save_tokenizer, train_tokenizer

__all__ = ["ARCHS", "MOE_ARCHS", "SIZE_PRESETS", "build_tiny_model", "build_tiny_reward_model", "make_config",
           "write_size_preset"]

ARCHS = ("qwen2", "llama", "mistral", "qwen3")  # dense: what build_tiny_model builds
MOE_ARCHS = ("qwen3_moe",)  # mixture of experts: make_config (experts=..., experts_per_token=...) and size presets
HEAD_DIM_ARCHS = ("mistral", "qwen3", "qwen3_moe")  # whose configs carry a head_dim of their own
SIZE_PRESETS = {
    "qwen2.5-0.5b": dict(arch="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                         vocab_size=151936, rope_theta=1e6, tie=True, rms_norm_eps=1e-6, max_position=32768),
    "qwen2.5-1.5b": dict(arch="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960,
                         vocab_size=151936, rope_theta=1e6, tie=True, rms_norm_eps=1e-6, max_position=32768),
    "qwen2.5-7b": dict(arch="qwen2", hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944,
                       vocab_size=152064, rope_theta=1e6, tie=False, rms_norm_eps=1e-6, max_position=32768),
    "llama3-8b": dict(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                      vocab_size=128256, rope_theta=5e5, tie=False, rms_norm_eps=1e-5, max_position=8192),
    # Qwen3-30B-A3B: 30,532,122,624 parameters, 3,353,032,704 active per token (non-expert + 8/128 of the experts),
    # counted on HF's meta-device Qwen3MoeForCausalLM (sum of numel).
    "qwen3-30b-a3b": dict(arch="qwen3_moe", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128,
                          intermediate=6144, experts=128, experts_per_token=8, expert_intermediate=768,
                          norm_topk_prob=True, vocab_size=151936, rope_theta=1e6, tie=False, rms_norm_eps=1e-6,
                          max_position=40960),
    # A full-fine-tuning MoE in the Qwen3-MoE family, shaped like OLMoE-1B-7B but with the Qwen vocab size:
    # 7,335,385,088 parameters, 1,698,240,512 active per token (non-expert + 8/64 of the experts), counted as above
    # (OLMoE's own 1.3B active has a 50k vocab; the untied 151936-row embedding and head add 0.4B here).
    "qwen3-moe-7b-a1b": dict(arch="qwen3_moe", hidden=2048, layers=16, heads=16, kv_heads=16, head_dim=128,
                             intermediate=1024, experts=64, experts_per_token=8, expert_intermediate=1024,
                             norm_topk_prob=True, vocab_size=151936, rope_theta=1e6, tie=False, rms_norm_eps=1e-6,
                             max_position=32768),
}
SHARD_BYTES = 2 * 1024**3  # module-level so tests can shrink it


def make_config(arch: str, *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                vocab_size: int, rope_theta: float = 1e6, tie: bool = True, rms_norm_eps: float = 1e-6,
                max_position: int = 4096, token_ids: dict | None = None, dtype: str = "float32",
                head_dim: int | None = None, experts: int | None = None, experts_per_token: int | None = None,
                expert_intermediate: int | None = None, norm_topk_prob: bool | None = None):
    """The HF config of `arch` (ARCHS or MOE_ARCHS). `head_dim` (default hidden // heads) is for the Qwen3 family and
    Mistral (full attention: no sliding window).
    For "qwen3_moe" `experts` (E) and `experts_per_token` (k) are required; `expert_intermediate` (default
    `intermediate`) is one expert's MLP width, `norm_topk_prob` (default True, as in Qwen3-MoE checkpoints)
    renormalises the k router weights; every layer is sparse (decoder_sparse_step 1, no mlp_only_layers), so
    `intermediate` only matters for configs that add dense layers. The MoE keywords are refused for dense archs."""
    import transformers

    if arch not in ARCHS + MOE_ARCHS:
        raise ValueError(f"arch={arch!r}: must be one of {ARCHS + MOE_ARCHS}")
    if heads % kv_heads or (head_dim is None and hidden % heads):
        raise ValueError(f"hidden={hidden}, heads={heads}, kv_heads={kv_heads}: hidden must be divisible by heads "
                         "(unless head_dim is given) and heads by kv_heads")
    moe = {k: v for k, v in dict(experts=experts, experts_per_token=experts_per_token,
                                 expert_intermediate=expert_intermediate, norm_topk_prob=norm_topk_prob).items()
           if v is not None}
    if arch not in MOE_ARCHS and moe:
        raise ValueError(f"arch={arch!r} is dense: {', '.join(sorted(moe))} only apply to {MOE_ARCHS}")
    if head_dim is not None and arch not in HEAD_DIM_ARCHS:
        raise ValueError(f"arch={arch!r}: head_dim only applies to {', '.join(HEAD_DIM_ARCHS)} (it is hidden // heads)")
    cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
           "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config,
           "qwen3_moe": transformers.Qwen3MoeConfig}[arch]
    kwargs = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab_size,
                  rope_theta=rope_theta, tie_word_embeddings=tie, rms_norm_eps=rms_norm_eps,
                  max_position_embeddings=max_position, **(token_ids or {}))
    if arch in HEAD_DIM_ARCHS:
        kwargs["head_dim"] = head_dim or hidden // heads
    if arch == "mistral":
        kwargs["sliding_window"] = None
    if arch in MOE_ARCHS:
        if experts is None or experts_per_token is None:
            raise ValueError(f"arch={arch!r}: experts and experts_per_token are required (got experts={experts}, "
                             f"experts_per_token={experts_per_token})")
        if not 1 <= experts_per_token <= experts:
            raise ValueError(f"experts_per_token={experts_per_token} must be between 1 and experts={experts}")
        kwargs.update(num_experts=experts, num_experts_per_tok=experts_per_token,
                      moe_intermediate_size=expert_intermediate or intermediate,
                      norm_topk_prob=True if norm_topk_prob is None else norm_topk_prob,
                      decoder_sparse_step=1, mlp_only_layers=[])
    config = cls(**kwargs)
    config.dtype = dtype
    return config


def _token_ids(hf_tok) -> dict:
    return {"bos_token_id": None, "eos_token_id": hf_tok.convert_tokens_to_ids("<|im_end|>"),
            "pad_token_id": hf_tok.pad_token_id}


def _write_generation_config(out_dir: Path, hf_tok) -> None:
    from transformers import GenerationConfig

    eos = [hf_tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=hf_tok.pad_token_id, do_sample=True).save_pretrained(out_dir)


def build_tiny_model(out_dir: str | Path, arch: str = "qwen2", layers: int = 2, hidden: int = 64, heads: int = 4,
                     kv_heads: int = 2, intermediate: int | None = None, seed: int = 0,
                     vocab_size: int = 512, head_dim: int | None = None) -> Path:
    """Write a tiny random HF causal LM + tokenizer into out_dir; returns the path. `head_dim`: see make_config."""
    from transformers import AutoModelForCausalLM

    if arch not in ARCHS:  # MoE shapes: make_config(..., experts=..., experts_per_token=...) or a size preset
        raise ValueError(f"arch={arch!r}: build_tiny_model builds one of {ARCHS}")
    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok = save_tokenizer(train_tokenizer(vocab_size), out_dir)
    config = make_config(arch, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         intermediate=intermediate or 2 * hidden, vocab_size=-(-len(hf_tok) // 64) * 64,
                         token_ids=_token_ids(hf_tok))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    _write_generation_config(out_dir, hf_tok)
    return out_dir


def build_tiny_reward_model(out_dir: str | Path, arch: str = "qwen2", layers: int = 2, hidden: int = 64,
                            heads: int = 4, kv_heads: int = 2, seed: int = 0, chat_template: str | None = None,
                            tokenizer_from: str | Path | None = None) -> Path:
    """Write a tiny random `...ForSequenceClassification` (num_labels=1, a reward model) + a tokenizer into out_dir:
    the tiny one, or the one in `tokenizer_from` copied (a reward model sharing a policy's tokenizer).
    `chat_template` replaces the tokenizer's own (a reward model that renders chats its own way)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is None:
        hf_tok = save_tokenizer(train_tokenizer(), out_dir)
    else:  # the files themselves, so the two directories hold the same tokenizer byte for byte
        for f in Path(tokenizer_from).expanduser().iterdir():
            if f.name.startswith("tokenizer") or f.name in ("vocab.json", "merges.txt", "special_tokens_map.json",
                                                            "chat_template.jinja"):
                shutil.copyfile(f, out_dir / f.name)
        hf_tok = AutoTokenizer.from_pretrained(str(out_dir))
    if chat_template is not None:
        hf_tok.chat_template = chat_template
        hf_tok.save_pretrained(str(out_dir))
    config = make_config(arch, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, intermediate=2 * hidden,
                         vocab_size=-(-len(hf_tok) // 64) * 64, token_ids=_token_ids(hf_tok))
    config.num_labels = 1
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).save_pretrained(out_dir)
    return out_dir


def _random_tensor(name: str, shape, std: float, gen: torch.Generator) -> torch.Tensor:
    """One parameter's random bf16 values on the CPU: ones for norms, zeros for biases, else normal(0, std) drawn
    in fp32 from `gen` on gen's device (CPU or CUDA) and cast."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.bfloat16)
    t = torch.empty(shape, dtype=torch.float32, device=gen.device).normal_(0.0, std, generator=gen)
    return t.to(torch.bfloat16).cpu()


def _plan_shards(params: list[tuple[str, tuple[int, ...]]]) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Group (name, shape) in order into shards of at most SHARD_BYTES of bf16 (a tensor alone over the limit gets
    its own shard), from the shapes alone so the shard count (in every file name) is known before writing."""
    shards, current, size = [], [], 0
    for name, shape in params:
        nbytes = 2 * torch.Size(shape).numel()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    if current:
        shards.append(current)
    return shards


def _write_random_weights(config, out_dir: Path, seed: int) -> None:
    """Random bf16 weights of `config` into out_dir as safetensors shards (+ model.safetensors.index.json when more
    than one), streamed: the shards are planned from a meta-device model's shapes, then each shard's tensors are
    generated, written and dropped before the next shard's are made (host memory ≈ one shard).

    The normal draws come from a generator seeded with `seed` on CUDA when torch.cuda.is_available() (much faster
    for tens of billions of parameters) and on the CPU otherwise; the two devices' generators give different values
    for the same seed, so the weights are deterministic per (seed, device kind), not across them. Same
    distributions on both: norms 1, biases 0, the rest normal(0, initializer_range), in bf16."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters()]  # tied weights appear once
    del model
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    shards = _plan_shards(params)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _random_tensor(name, shape, config.initializer_range, gen) for name, shape in shard}
        save_file(tensors, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_size_preset(out_dir: str | Path, size: str, weights: bool = True, seed: int = 0) -> Path:
    """Real-architecture config (bf16) + tiny tokenizer, and random bf16 weights unless weights=False."""
    if size not in SIZE_PRESETS:
        raise ValueError(f"size={size!r}: unknown preset; choose one of {sorted(SIZE_PRESETS)}")
    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok = save_tokenizer(train_tokenizer(), out_dir)
    spec = dict(SIZE_PRESETS[size])
    config = make_config(spec.pop("arch"), **spec, token_ids=_token_ids(hf_tok), dtype="bfloat16")
    config.save_pretrained(out_dir)
    _write_generation_config(out_dir, hf_tok)
    if weights:
        _write_random_weights(config, out_dir, seed)
    return out_dir
