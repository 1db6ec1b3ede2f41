"""What an HF config says about its mixture-of-experts layers, read in one place (no torch import: the TP rules
and the run plan read config.json dicts with it).

Choices:
- Two router families, read from their own keys: Qwen3-MoE (`num_experts` — `num_local_experts` in configs
  written by transformers 5 — `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`, and the dense
  layers it keeps: `mlp_only_layers`, `decoder_sparse_step`) and Mixtral (`num_local_experts`,
  `num_experts_per_tok`, experts of `intermediate_size`, every layer sparse, top-k weights always renormalised).
- Both take the softmax over all router logits in fp32, then the top k. They differ in the dtype of the top-k
  weights that scale the expert outputs: Qwen3-MoE casts them to the model dtype first, Mixtral keeps them in fp32
  (`weights_fp32`). The engine follows each, so its bf16 outputs match HF's.
- A config of another model type gives None (dense); a Qwen3-MoE config with zero experts is all dense, as in HF.

Shape legend: E experts, k experts per token, I one expert's intermediate size.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MOE_MODEL_TYPES", "MoEConfig", "moe_config"]

MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int                 # E
    top_k: int                       # k
    intermediate: int                # I, of one expert
    norm_topk_prob: bool             # renormalise the k weights to sum to 1
    weights_fp32: bool               # scale expert outputs by fp32 weights (Mixtral) or model-dtype ones (Qwen3-MoE)
    sparse_layers: tuple[bool, ...]  # per decoder layer: MoE (True) or the dense MLP of `intermediate_size`

    @property
    def num_sparse(self) -> int:
        return sum(self.sparse_layers)

    @property
    def num_dense(self) -> int:
        return len(self.sparse_layers) - self.num_sparse


def _getter(config):
    return config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)


def moe_config(config) -> MoEConfig | None:
    """The MoE layout of an HF config (an object or a config.json dict); None for dense model types. ValueError
    naming the key for a layout the engine cannot run (no experts per token, more than there are experts)."""
    get = _getter(config)
    model_type = get("model_type")
    if model_type not in MOE_MODEL_TYPES:
        return None
    layers = int(get("num_hidden_layers"))
    top_k = int(get("num_experts_per_tok", 0) or 0)
    if model_type == "qwen3_moe":
        experts = int(get("num_experts", None) or get("num_local_experts", None) or 0)
        intermediate = int(get("moe_intermediate_size"))
        step = int(get("decoder_sparse_step", 1) or 1)
        dense = set(get("mlp_only_layers", None) or ())
        sparse = tuple(experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(layers))
        norm, fp32 = bool(get("norm_topk_prob", False)), False
    else:  # mixtral
        experts = int(get("num_local_experts", 0) or 0)
        intermediate = int(get("intermediate_size"))
        sparse = (True,) * layers
        norm, fp32 = True, True
    if any(sparse) and not 1 <= top_k <= experts:
        raise ValueError(f"{model_type}: num_experts_per_tok={top_k} must be between 1 and the number of experts "
                         f"({experts})")
    return MoEConfig(num_experts=experts, top_k=top_k, intermediate=intermediate, norm_topk_prob=norm,
                     weights_fp32=fp32, sparse_layers=sparse)
