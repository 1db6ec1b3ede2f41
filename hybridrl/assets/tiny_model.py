"""Offline model assets: tiny random HF models for tests, real-shaped random models for GPU benchmarks.

Choices:
- Models come from the real HF config classes (Qwen2, Llama, Qwen3), so the code under test loads them through
  `AutoModelForCausalLM.from_pretrained` exactly like a downloaded checkpoint; no hub access is needed.
- The tiny model is initialised by HF's own `_init_weights` under `torch.manual_seed(seed)` (deterministic), in
  fp32, and saved with `save_pretrained` (config.json, model.safetensors, generation_config.json). Its vocab
  is the tokenizer's size rounded up to a multiple of 64 (ids always < vocab_size, embedding rows aligned).
- Size presets keep the published shapes (hidden, layers, heads, kv heads, intermediate, vocab, rope theta,
  tied embeddings). Their weights are never a full model in memory: tensor shapes come from a meta-device
  model and random bf16 tensors (normal(0, initializer_range), ones for norms, zeros for biases) are streamed
  into ~2 GB safetensors shards with an index. `weights=False` writes only config + tokenizer (a benchmark may
  initialise on the GPU instead).
- The tiny reward model is the same backbone as a `...ForSequenceClassification` with num_labels=1.
- Every model directory also holds the tiny tokenizer (see tokenizer.py) and a generation_config with
  eos = <|im_end|> and <|endoftext|>, pad = <|pad|>.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hybridrl.assets.tokenizer import save_tokenizer, train_tokenizer

__all__ = ["ARCHS", "SIZE_PRESETS", "build_tiny_model", "build_tiny_reward_model", "make_config",
           "write_size_preset"]

ARCHS = ("qwen2", "llama", "qwen3")
SIZE_PRESETS = {
    "qwen2.5-0.5b": dict(arch="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                         vocab_size=151936, rope_theta=1e6, tie=True, rms_norm_eps=1e-6, max_position=32768),
    "qwen2.5-1.5b": dict(arch="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960,
                         vocab_size=151936, rope_theta=1e6, tie=True, rms_norm_eps=1e-6, max_position=32768),
    "qwen2.5-7b": dict(arch="qwen2", hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944,
                       vocab_size=152064, rope_theta=1e6, tie=False, rms_norm_eps=1e-6, max_position=32768),
    "llama3-8b": dict(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                      vocab_size=128256, rope_theta=5e5, tie=False, rms_norm_eps=1e-5, max_position=8192),
}
SHARD_BYTES = 2 * 1024**3  # module-level so tests can shrink it


def make_config(arch: str, *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                vocab_size: int, rope_theta: float = 1e6, tie: bool = True, rms_norm_eps: float = 1e-6,
                max_position: int = 4096, token_ids: dict | None = None, dtype: str = "float32"):
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r}: must be one of {ARCHS}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden={hidden}, heads={heads}, kv_heads={kv_heads}: hidden must be divisible by heads "
                         "and heads by kv_heads")
    cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
           "qwen3": transformers.Qwen3Config}[arch]
    kwargs = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab_size,
                  rope_theta=rope_theta, tie_word_embeddings=tie, rms_norm_eps=rms_norm_eps,
                  max_position_embeddings=max_position, **(token_ids or {}))
    if arch == "qwen3":
        kwargs["head_dim"] = hidden // heads
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
                     vocab_size: int = 512) -> Path:
    """Write a tiny random HF causal LM + tokenizer into out_dir; returns the path."""
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok = save_tokenizer(train_tokenizer(vocab_size), out_dir)
    config = make_config(arch, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
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
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.bfloat16)
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen).to(torch.bfloat16)


def _write_random_weights(config, out_dir: Path, seed: int) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters()]  # tied weights appear once
    gen = torch.Generator().manual_seed(seed)
    shards, current, size = [], {}, 0
    for name, shape in params:
        t = _random_tensor(name, shape, config.initializer_range, gen)
        if current and size + t.numel() * 2 > SHARD_BYTES:  # a tensor alone over the limit gets its own shard
            shards.append(current)
            current, size = {}, 0
        current[name], size = t, size + t.numel() * 2
    if current:
        shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
        total += sum(t.numel() * 2 for t in shard.values())
        shard.clear()
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
