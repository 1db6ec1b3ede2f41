"""The few numbers of a decoder-only HF model that decide its memory: counts, widths, vocabulary."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool

    @classmethod
    def from_hf_config(cls, cfg) -> ModelShape:
        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
        return cls(layers=int(cfg.num_hidden_layers), hidden=hidden, intermediate=int(cfg.intermediate_size),
                   heads=heads, kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
                   head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads), vocab=int(cfg.vocab_size),
                   tied=bool(getattr(cfg, "tie_word_embeddings", False)),
                   qkv_bias=bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2")

    @property
    def layer_params(self) -> int:
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return h * q + 2 * h * kv + q * h + bias + 3 * h * self.intermediate + 2 * h

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        """Parameters of the causal LM (the head counted once when tied to the embedding)."""
        return self.layers * self.layer_params + self.embed_params * (1 if self.tied else 2) + self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all layers in bf16 (before TP splits the heads)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def train_act_bytes_per_token_layer(self, liger: bool = False) -> int:
        """Activations autograd saves for one token of one decoder layer (bf16 compute, HF graph, fused attention):
        the two RMSNorms' fp32 inputs and bf16 outputs (the outputs are also the q/k/v and gate/up inputs), the
        attention's q, k, v and output, the output projection's input, and the MLP's gate, up, act and product.
        With Liger's kernels (training/liger.py) the RMSNorms save their bf16 inputs and a per-row fp32 rstd, and
        SwiGLU saves gate and up only (the SiLU is recomputed in backward)."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        if liger:
            return 2 * 2 * h + 2 * 4 + 2 * 2 * h + 2 * (3 * q + 2 * kv) + 2 * 3 * i
        return 2 * 4 * h + 2 * 2 * h + 2 * (3 * q + 2 * kv) + 2 * 4 * i

    def layer_backward_bytes_per_token(self, liger: bool = False) -> int:
        """A decoder layer's backward beyond what it saved: the MLP's gradients (down input, act, gate and up, bf16)
        alive at once; Liger's SwiGLU writes the gate and up gradients over its saved inputs."""
        return 2 * (1 if liger else 3) * self.intermediate

    @property
    def infer_act_bytes_per_token(self) -> int:
        """Transient memory of one token in a no-grad forward: the widest tensors alive at once (MLP)."""
        return 2 * (4 * self.hidden + 3 * self.intermediate)
