"""The few numbers of a decoder-only HF model that decide its memory: counts, widths, vocabulary.

Choices:
- A mixture-of-experts model (models/moe_config.py) adds its experts: `moe_layers` of the `layers` hold
  `experts` SwiGLU experts of width `expert_intermediate` and a router, the others the dense MLP of
  `intermediate`. `num_params` counts every expert (what is stored, sharded and reshard-ed); `active_params` counts
  the `experts_per_token` a token runs through (what its FLOPs scale with); `layer_params` is the largest layer
  (what FSDP unshards at once).
- Per-token activation widths take the wider of the two layer kinds: the dense MLP's `intermediate`, or the k
  experts' `experts_per_token * expert_intermediate` plus what dispatching the token to them saves for backward
  (`moe_dispatch_bytes_per_token`: its k gathered rows, the router's fp32 probabilities and top-k, the routing
  weights and the index vectors of training/moe_experts.py's forward; checked against autograd's saved tensors
  in tests/plan/test_moe_memory.py). The router losses keep every MoE layer's router logits (and their
  loss graphs) until backward, checkpointing or not (`router_loss_bytes_per_token`); routing replay's record
  takes `routing_record_bytes_per_token` beside each token's K/V in the engine.

Shape legend: h hidden, q = heads·head_dim, kv = kv_heads·head_dim, i intermediate, E experts, k experts per token,
Ie one expert's intermediate.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.models.moe_config import moe_config

# transformers 5's fused expert tensors (their names as LoRA targets) -> their size in units of E·h·Ie
EXPERT_TENSORS = {"experts.gate_up_proj": 2, "experts.down_proj": 1}


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
    qk_norm: bool = False          # per-head RMSNorm weights on q and k (Qwen3, Qwen3-MoE)
    moe_layers: int = 0            # layers holding an MoE block instead of the dense MLP
    experts: int = 0               # E
    experts_per_token: int = 0     # k
    expert_intermediate: int = 0   # Ie

    @classmethod
    def from_hf_config(cls, cfg) -> ModelShape:
        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
        moe = moe_config(cfg)
        experts = {} if moe is None or not moe.num_sparse else dict(
            moe_layers=moe.num_sparse, experts=moe.num_experts, experts_per_token=moe.top_k,
            expert_intermediate=moe.intermediate)
        return cls(layers=int(cfg.num_hidden_layers), hidden=hidden, intermediate=int(cfg.intermediate_size),
                   heads=heads, kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
                   head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads), vocab=int(cfg.vocab_size),
                   tied=bool(getattr(cfg, "tie_word_embeddings", False)),
                   qkv_bias=bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2",
                   qk_norm=cfg.model_type in ("qwen3", "qwen3_moe"), **experts)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def _attention_and_norms(self) -> int:
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return h * q + 2 * h * kv + q * h + bias + 2 * h + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def dense_layer_params(self) -> int:
        return self._attention_and_norms + 3 * self.hidden * self.intermediate

    def _moe_layer(self, experts: int) -> int:
        return self._attention_and_norms + self.experts * self.hidden + experts * 3 * self.hidden * self.expert_intermediate

    @property
    def moe_layer_params(self) -> int:
        """Parameters of one MoE layer: attention, norms, the router and every expert."""
        return self._moe_layer(self.experts)

    @property
    def layer_params(self) -> int:
        """The largest decoder layer's parameters."""
        return max(self.dense_layer_params if self.dense_layers else 0, self.moe_layer_params if self.moe_layers else 0)

    @property
    def decoder_params(self) -> int:
        return self.dense_layers * self.dense_layer_params + self.moe_layers * self.moe_layer_params

    @property
    def decoder_active_params(self) -> int:
        """The decoder parameters one token runs through: the k routed experts of each MoE layer, not all E."""
        return self.dense_layers * self.dense_layer_params + self.moe_layers * self._moe_layer(self.experts_per_token)

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        """Parameters of the causal LM (the head counted once when tied to the embedding), every expert included."""
        return self.decoder_params + self.embed_params * (1 if self.tied else 2) + self.hidden

    @property
    def active_params(self) -> int:
        """Parameters one token runs through (equal to num_params for a dense model)."""
        return self.decoder_active_params + self.embed_params * (1 if self.tied else 2) + self.hidden

    def engine_whole_params(self, lora_targets: tuple[str, ...] = ()) -> int:
        """Parameters the rollout engine holds at TP = 1 as whole tensors in HF's layout — embeddings, the LM head,
        norms, o_proj, the dense down_proj, routers and experts (q/k/v and gate/up are fused there) — less those
        named in `lora_targets`, which reach the engine merged (models/decoder.py `borrowable`, hybrid/reshard.py).
        A borrowing engine gets LoRA-targeted linears merged but not expert tensors (`experts.gate_up_proj`,
        `experts.down_proj`): it borrows their base and adds the update unmerged, so the plan passes linears only."""
        h, q = self.hidden, self.heads * self.head_dim
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        o_proj = 0 if "o_proj" in lora_targets else q * h
        down = 0 if "down_proj" in lora_targets else self.intermediate * h
        whole_experts = [n for n in EXPERT_TENSORS if n not in lora_targets]
        moe = self.experts * h + self.expert_tensor_params(whole_experts)
        return (self.layers * (norms + o_proj) + self.dense_layers * down + self.moe_layers * moe
                + self.embed_params * (1 if self.tied else 2) + h)

    def expert_tensor_params(self, names) -> int:
        """Parameters of one MoE layer's fused expert tensors among `names` (EXPERT_TENSORS: gate_up_proj
        [E, 2·Ie, h], down_proj [E, h, Ie])."""
        return sum(EXPERT_TENSORS[n] * self.experts * self.hidden * self.expert_intermediate for n in names)

    @property
    def token_mlp_width(self) -> int:
        """The MLP activation width of one token: the dense intermediate or the k experts' together, the wider."""
        return max(self.intermediate if self.dense_layers else 0,
                   self.experts_per_token * self.expert_intermediate if self.moe_layers else 0)

    @property
    def moe_dispatch_bytes_per_token(self) -> int:
        """An MoE layer's per-token extras saved for backward (training/moe_experts.py): the k gathered input rows
        (bf16), the router's fp32 softmax, its fp32 top-k values and their sum, the int64 top-k ids and sort
        permutation, the two int32 gather indices and the k bf16 routing weights."""
        if not self.moe_layers:
            return 0
        k = self.experts_per_token
        return 2 * k * self.hidden + 4 * self.experts + 4 * (k + 1) + 2 * 8 * k + 2 * 4 * k + 2 * k

    def router_loss_bytes_per_token(self, aux: bool, z: bool) -> int:
        """What the router losses keep per token from the forward to the backward: per MoE layer its router logits
        (bf16), for the load-balancing loss their softmax (bf16), for the z-loss their fp32 copy and an fp32
        per-token value; and each loss's fp32 token mask."""
        if not self.moe_layers or not (aux or z):
            return 0
        e = self.experts
        return self.moe_layers * (2 * e + (2 * e if aux else 0) + (4 * e + 4 if z else 0)) + 4 * (aux + z)

    @property
    def routing_record_bytes_per_token(self) -> int:
        """The rollout engine's record of a token's experts (routing replay): k ids per MoE layer, uint8 up to 254
        experts, else int16 (models/moe.py routing_dtype)."""
        return self.moe_layers * self.experts_per_token * (1 if self.experts < 255 else 2)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all layers in bf16 (before TP splits the heads)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def train_act_bytes_per_token_layer(self, liger: bool = False) -> int:
        """Activations autograd saves for one token of one decoder layer (bf16 compute, HF graph, fused attention):
        the two RMSNorms' fp32 inputs and bf16 outputs (the outputs are also the q/k/v and gate/up inputs), the
        attention's q, k, v and output, the output projection's input, and the MLP's (`_mlp_saved_bytes`).
        With Liger's kernels (training/liger.py) the RMSNorms save their bf16 inputs and a per-row fp32 rstd."""
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        mlp = self._mlp_saved_bytes(liger)
        if liger:
            return 2 * 2 * h + 2 * 4 + 2 * 2 * h + 2 * (3 * q + 2 * kv) + mlp
        return 2 * 4 * h + 2 * 2 * h + 2 * (3 * q + 2 * kv) + mlp

    def _mlp_saved_bytes(self, liger: bool) -> int:
        """The wider layer kind's MLP: the dense SwiGLU's gate, up, act and product (bf16; Liger's SwiGLU saves gate
        and up only and recomputes the SiLU), or the experts' gate|up and weighted product (training/moe_experts.py
        recomputes the SiLU) with the dispatch."""
        dense = 2 * (3 if liger else 4) * self.intermediate if self.dense_layers else 0
        experts = (2 * 3 * self.experts_per_token * self.expert_intermediate + self.moe_dispatch_bytes_per_token
                   if self.moe_layers else 0)
        return max(dense, experts)

    def layer_backward_bytes_per_token(self, liger: bool = False) -> int:
        """A decoder layer's backward beyond what it saved, the wider layer kind: the dense MLP's gradients (down
        input, act, gate and up, bf16) alive at once, of which Liger's SwiGLU writes the gate and up gradients over
        its saved inputs; the experts' (training/moe_experts.py) the down input's gradient with the SwiGLU
        backward's four k·Ie-wide temporaries, and the k gathered rows' gradient with its token-order copy."""
        dense = 2 * (1 if liger else 3) * self.intermediate if self.dense_layers else 0
        experts = (2 * 5 * self.experts_per_token * self.expert_intermediate + 2 * 2 * self.experts_per_token
                   * self.hidden if self.moe_layers else 0)
        return max(dense, experts)

    @property
    def infer_act_bytes_per_token(self) -> int:
        """Transient memory of one token in a no-grad forward: the widest tensors alive at once (MLP)."""
        return 2 * (4 * self.hidden + 3 * self.token_mlp_width) + self.moe_dispatch_bytes_per_token
