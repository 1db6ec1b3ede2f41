"""Which tensor-parallel degrees the rollout decoder can split a model into (no torch import: config checks use it).

The decoder (tp_layers.py, moe.py) splits attention by whole heads, the MLP by rows of intermediate_size, a
mixture-of-experts block by rows of every expert's intermediate size (or, with expert parallelism, by whole
experts), and pads the vocab, so a TP degree must
- divide num_attention_heads (each rank holds whole query heads),
- divide num_key_value_heads, or be a multiple of it (then KV heads are replicated, as in vLLM),
- divide intermediate_size when some layer has the dense MLP,
- divide the experts' intermediate size when some layer is an MoE block (the number of experts instead, with
  expert parallelism).
SmolLM2-135M (9 heads, 3 KV heads, intermediate 1536) thus allows 1 and 3: not 2 (9 heads), not 9 (1536).
"""

from __future__ import annotations

import json
from pathlib import Path

from hybridrl.models.moe_config import moe_config

__all__ = ["allowed_tp_sizes", "model_sp_error", "model_tp_error", "tp_size_error"]

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def _get(config):
    return config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)


def _shape(config, expert_parallel: bool = False) -> tuple[int, int, dict[str, int]]:
    """(heads, kv heads, {what: size} of every width a TP degree must divide beyond the heads)."""
    get = _get(config)
    heads = int(get("num_attention_heads"))
    kv_heads = int(get("num_key_value_heads", None) or heads)
    moe = moe_config(config)
    widths = {}
    if moe is None or moe.num_dense:
        widths["intermediate_size"] = int(get("intermediate_size"))
    if moe is not None and moe.num_sparse:
        if expert_parallel:
            widths["the number of experts"] = moe.num_experts
        else:
            widths["the experts' intermediate size"] = moe.intermediate
    return heads, kv_heads, widths


def _fits(tp: int, heads: int, kv_heads: int, widths: dict[str, int]) -> bool:
    return (heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)
            and all(size % tp == 0 for size in widths.values()))


def allowed_tp_sizes(config, expert_parallel: bool = False) -> list[int]:
    """Every TP degree the decoder accepts for this HF config (an object or a config.json dict)."""
    heads, kv_heads, widths = _shape(config, expert_parallel)
    return [tp for tp in range(1, heads + 1) if _fits(tp, heads, kv_heads, widths)]


def tp_size_error(config, tp: int, expert_parallel: bool = False) -> str | None:
    """None when `tp` fits the model, else the reason, naming the key, the value, the model's shape and the rule."""
    heads, kv_heads, widths = _shape(config, expert_parallel)
    if _fits(tp, heads, kv_heads, widths):
        return None
    model_type = _get(config)("model_type")
    sizes = ", ".join(f"{what} {size}" for what, size in widths.items())
    rule = " and ".join(f"divide {what}" for what in widths)
    return (f"'{TP_KEY}' = {tp} does not fit the model ({model_type}: {heads} attention heads, {kv_heads} KV heads, "
            f"{sizes}): the TP degree must divide the attention heads, divide the KV heads or be a multiple of them, "
            f"and {rule}; allowed: {allowed_tp_sizes(config, expert_parallel)}")


def model_tp_error(model_path, tp: int) -> str | None:
    """tp_size_error for the config.json under a local model directory; None when there is none to read (a hub
    name, or a directory made later): the engine checks again when it builds the model."""
    config_file = Path(str(model_path)).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if "num_attention_heads" not in config or "intermediate_size" not in config:
        return None  # not a decoder config the native engine reads; check_supported names the problem
    return tp_size_error(config, tp)


def model_sp_error(model_path, sp: int, key: str) -> str | None:
    """Why Ulysses degree `sp` (the value of `key`) cannot split the attention heads of the model under `model_path`
    (each rank of a Ulysses group attends with heads / sp of them), or None; None too where there is no config.json
    to read."""
    config_file = Path(str(model_path)).expanduser() / "config.json"
    if sp <= 1 or not config_file.is_file():
        return None
    heads = json.loads(config_file.read_text()).get("num_attention_heads")
    if not isinstance(heads, int) or heads % sp == 0:
        return None
    allowed = [d for d in range(1, heads + 1) if heads % d == 0]
    return (f"'{key}' = {sp} must divide the model's {heads} attention heads (each rank of a Ulysses group attends "
            f"with heads / SP of them); allowed: {allowed}")
