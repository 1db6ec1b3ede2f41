"""One tensor-parallel decoder for the rollout engine: Qwen2/Qwen2.5, Llama 3, Mistral, Qwen3, and the
mixture-of-experts Qwen3-MoE and Mixtral (full attention: a model's sliding window must hold the run's sequences).

Choices:
- The families differ only in small switches, read from the HF config: q/k/v bias (Qwen2
  always, others `attention_bias`), per-head RMSNorm on q and k (Qwen3, Qwen3-MoE), rope type ('default' or
  Llama 3's 'llama3'), tied or untied embeddings, and, per layer, the dense MLP or a mixture-of-experts block
  (moe.py; which layers and how they route: moe_config.py). One module covers them; anything else raises
  ValueError naming the model type and pointing to `rollout.name=hf` (the HF backend).
- The model knows nothing about paging: attention calls `ctx.attend(layer_idx, q, k, v)` on the context
  object the runner passes in (no global context), which writes K/V into the paged cache and runs
  the prefill or decode kernel. Tokens are flattened ([T, ...]) across sequences, as in nano-vllm.
- Only the last token's hidden state of each prefill sequence reaches the LM head (`logits_index`).
- HF names map to fused parameters in `load_hf_weight`: q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj;
  the MoE block keeps HF's names (`mlp.gate.weight`, `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`).
- LoRA on the experts at TP = 1 can stay unmerged: `add_expert_adapter` gives an experts tensor its factors
  (`<hf name>_lora_A` / `_lora_B`), which the block adds beside the (borrowed) base tensor (moe.py).
- MoE blocks record each token's experts in the step's context when it holds a routing record (moe.py).
- On the fused path a dense MLP of at most fused_mlp.ENGINE_MAX_ROWS rows (a decode step's batch) runs as one
  kernel plus a reduce (fused_mlp.py), its down projection's all-reduce and bias as RowParallelLinear's.
- CUDA graphs: a model whose MoE blocks would take the host-synchronising fallback on the device (moe.py) says so
  through `cuda_graph_safe(device, dtype)`, and the runner then decodes eagerly.

Shape legend: T tokens, H hidden, N heads (local), K kv heads (local), D head_dim.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from hybridrl.models import fused, fused_mlp
from hybridrl.models.moe import Experts, SparseMoeBlock
from hybridrl.models.moe_config import moe_config
from hybridrl.models.rope import apply_rope, inv_frequencies
from hybridrl.models.tp_layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    column_parts,
    tp_rank_size,
)
from hybridrl.models.tp_rules import tp_size_error

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral", "qwen3", "qwen3_moe", "mixtral")
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")

# HF sub-module name -> (our fused parameter's module name, shard id)
FUSED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
PER_EXPERT_NAME = re.compile(r"\.experts\.\d+\.")  # experts.<e>.gate_proj.weight: the layout before transformers 5


def attention_window(config) -> int | None:
    """The sliding window HF's attention applies to this model (None: full attention): Mistral's and Mixtral's
    `sliding_window`, Qwen2's where `use_sliding_window` is on."""
    mt = getattr(config, "model_type", None)
    on = mt in ("mistral", "mixtral") or getattr(config, "use_sliding_window", False)
    window = getattr(config, "sliding_window", None) if on else None
    return None if window is None else int(window)


def window_error(config, max_len: int | None) -> str | None:
    """Why a model with a sliding attention window cannot run sequences of `max_len` tokens here (None: it can): the
    engine and the packed training attention attend fully, which is the window's result only where no sequence is
    longer than the window."""
    window = attention_window(config)
    if window is None or (max_len is not None and max_len <= window):
        return None
    return (f"{getattr(config, 'model_type', None)}: sliding_window={window} is narrower than the run's sequences "
            f"({'unknown length' if max_len is None else f'{max_len} tokens'}: data.max_prompt_length + "
            "data.max_response_length): sliding-window attention is not implemented, so only runs whose prompt + "
            f"response fit in the window ({window} tokens) attend as the model does")


def check_supported(config, tp_size: int = 1, expert_parallel: bool = False, max_model_len: int | None = None) -> None:
    """ValueError naming what the native engine cannot run: the model type, an option, a sliding window narrower
    than `max_model_len`, or a TP degree that does not split its heads, MLP or experts (see tp_rules.py)."""
    mt = getattr(config, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {mt!r} is not supported by the native rollout engine (supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}); set actor_rollout_ref.rollout.name=hf")
    error = window_error(config, max_model_len)
    if error:
        raise ValueError(error)
    if getattr(config, "mlp_bias", False):
        raise ValueError(f"{mt}: mlp_bias=True is not supported by the native rollout engine; "
                         "set actor_rollout_ref.rollout.name=hf")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"{mt}: hidden_act={config.hidden_act!r} is not supported (only silu); "
                         "set actor_rollout_ref.rollout.name=hf")
    inv_frequencies(config, head_dim_of(config))  # raises on unsupported rope types
    moe_config(config)  # raises on an MoE layout it cannot route
    error = tp_size_error(config, tp_size, expert_parallel)
    if error:
        raise ValueError(error)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, config, layer_idx: int, tp_group):
        super().__init__()
        self.layer_idx = layer_idx
        d = head_dim_of(config)
        nh, nkv = config.num_attention_heads, config.num_key_value_heads
        bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
        parts = column_parts({"q": nh * d, "k": nkv * d, "v": nkv * d}, tp_group, {"k": d, "v": d})
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, parts, bias, tp_group)
        self.num_heads, self.num_kv_heads, self.head_dim = parts["q"][1] // d, parts["k"][1] // d, d
        self.o_proj = RowParallelLinear(nh * d, config.hidden_size, getattr(config, "attention_bias", False)
                                        and config.model_type != "qwen2", tp_group)
        self.qk_norm = config.model_type in QK_NORM_MODEL_TYPES
        if self.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps)
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
        self.scale = d**-0.5

    def forward(self, x_TH, cos_TD, sin_TD, ctx, use_fused=False):
        T = x_TH.shape[0]
        q, k, v = self.qkv_proj(x_TH).split([self.num_heads * self.head_dim,
                                             self.num_kv_heads * self.head_dim,
                                             self.num_kv_heads * self.head_dim], dim=-1)
        q_TND = q.view(T, self.num_heads, self.head_dim)
        k_TKD = k.view(T, self.num_kv_heads, self.head_dim)
        v_TKD = v.view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q_TND, k_TKD = self.q_norm(q_TND), self.k_norm(k_TKD)
        if use_fused:  # rope in place + K/V cache store in one kernel, inside ctx.attend
            o_TND = ctx.attend(self.layer_idx, q_TND, k_TKD, v_TKD, self.scale, rope=(cos_TD, sin_TD))
        else:
            q_TND, k_TKD = apply_rope(q_TND, cos_TD, sin_TD), apply_rope(k_TKD, cos_TD, sin_TD)
            o_TND = ctx.attend(self.layer_idx, q_TND, k_TKD, v_TKD.contiguous(), self.scale)
        return self.o_proj(o_TND.reshape(T, -1))


class MLP(nn.Module):
    def __init__(self, config, tp_group):
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, column_parts({0: inter, 1: inter}, tp_group),
                                                 False, tp_group)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, False, tp_group)

    def forward(self, x, use_fused=False, ctx=None):  # ctx: read by MoE blocks only (their routing record)
        if use_fused:
            w_gate_up, w_down = self.gate_up_proj.weight, self.down_proj.weight
            if fused_mlp.serves(x, w_gate_up, w_down):  # decode-sized batches: one kernel + a reduce
                return self.down_proj.reduce(fused_mlp.fused_mlp(x, w_gate_up, w_down, tile=fused_mlp.DECODE_TILE))
            return self.down_proj(fused.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx, tp_group, moe=None, expert_parallel=False):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx, tp_group)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if moe is not None and moe.sparse_layers[layer_idx]:
            self.mlp = SparseMoeBlock(config, moe, tp_group, expert_parallel, sum(moe.sparse_layers[:layer_idx]))
        else:
            self.mlp = MLP(config, tp_group)

    def forward(self, h, cos, sin, ctx):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx)
        return h + self.mlp(self.post_attention_layernorm(h), ctx=ctx)


class DecoderModel(nn.Module):
    def __init__(self, config, tp_group, expert_parallel=False):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp_group)
        moe = moe_config(config)
        self.layers = nn.ModuleList(DecoderLayer(config, i, tp_group, moe, expert_parallel)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TPDecoderForCausalLM(nn.Module):
    """forward(input_ids_T, positions_T, ctx) -> final hidden states [T, H]; compute_logits(h) -> [S, V].
    `expert_parallel` splits an MoE model's experts whole across the TP ranks instead of their intermediate
    columns (moe.py)."""

    def __init__(self, config, tp_group=None, expert_parallel: bool = False, max_model_len: int | None = None):
        super().__init__()
        check_supported(config, tp_rank_size(tp_group)[1], expert_parallel, max_model_len)
        self.config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.model = DecoderModel(config, tp_group, expert_parallel)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp_group)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope_cache = None  # [2, max_len, D] fp32, set by the runner on wake-up
        self.fused_fits = fused.head_dim_fits(head_dim_of(config))

    def forward(self, input_ids_T, positions_T, ctx):
        h = self.model.embed_tokens(input_ids_T)
        cos, sin = (c.index_select(0, positions_T).to(h.dtype) for c in self.rope_cache)
        if self.fused_fits and fused.enabled(h):
            return self._forward_fused(h, cos, sin, ctx)
        for layer in self.model.layers:
            h = layer(h, cos, sin, ctx)
        return self.model.norm(h)

    def _forward_fused(self, h, cos, sin, ctx):
        """Same math as the loop above with the residual carried separately (vLLM style): every
        residual add is fused into the following RMSNorm kernel."""
        residual = None
        for layer in self.model.layers:
            ln = layer.input_layernorm
            x, residual = fused.add_rmsnorm(h, residual, ln.weight, ln.eps)
            h = layer.self_attn(x, cos, sin, ctx, use_fused=True)
            ln = layer.post_attention_layernorm
            x, residual = fused.add_rmsnorm(h, residual, ln.weight, ln.eps)
            h = layer.mlp(x, use_fused=True, ctx=ctx)
        norm = self.model.norm
        return fused.add_rmsnorm(h, residual, norm.weight, norm.eps)[0]

    def compute_logits(self, h_SH):
        return self.lm_head(h_SH)

    def cuda_graph_safe(self, device, dtype) -> bool:
        """False when a layer's forward would synchronise with the host on this device and dtype (an MoE block on
        its fallback backend), so a decode step cannot be captured in a CUDA graph."""
        device = torch.device(device)
        return all(layer.mlp.graph_safe(device, dtype) for layer in self.model.layers
                   if isinstance(layer.mlp, SparseMoeBlock))

    # ------------------------------------------------------------------ weights
    def resolve_hf_name(self, hf_name: str):
        """HF name -> (our name, our parameter, shard id) or None for names that carry no weight (rotary buffers)."""
        if hf_name.endswith(IGNORED_SUFFIXES):
            return None
        name, shard_id = hf_name, None
        parts = hf_name.split(".")
        if len(parts) >= 2 and parts[-2] in FUSED:
            fused, shard_id = FUSED[parts[-2]]
            name = ".".join(parts[:-2] + [fused, parts[-1]])
        if name == "lm_head.weight" and self.tie_word_embeddings:
            name = "model.embed_tokens.weight"
        if PER_EXPERT_NAME.search(hf_name):
            raise ValueError(f"load_weights: {hf_name!r} is a per-expert weight name; the native engine takes the "
                             "fused experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I] of transformers>=5 "
                             "models (load the model with transformers 5, which converts older checkpoints)")
        try:
            param = self.get_parameter(name)
        except AttributeError:
            raise ValueError(f"load_weights: unknown weight name {hf_name!r} for model_type "
                             f"{self.config.model_type!r}") from None
        module_name, _, param_name = name.rpartition(".")
        return name, param, self.get_submodule(module_name), param_name, shard_id

    def hf_weight_shard_spec(self, hf_name: str, full_shape):
        resolved = self.resolve_hf_name(hf_name)
        if resolved is None:
            return None
        _, _, module, param_name, shard_id = resolved
        spec = getattr(module, "shard_spec", None)
        return None if spec is None else spec(param_name, shard_id)

    def borrowable(self, hf_name: str, full_shape=None) -> str | None:
        """Our name of the parameter that is the whole HF tensor `hf_name` in HF's layout on this rank (not fused
        with a sibling, not sliced by TP; of `full_shape` where given), which the engine can therefore use in place;
        None otherwise."""
        resolved = self.resolve_hf_name(hf_name)
        if resolved is None:
            return None
        name, param, module, param_name, shard_id = resolved
        spec = getattr(module, "shard_spec", None)
        whole = shard_id is None and (spec is None or spec(param_name, shard_id) is None)
        return name if whole and (full_shape is None or tuple(param.shape) == tuple(full_shape)) else None

    def add_expert_adapter(self, hf_name: str, rank: int, scaling: float) -> tuple[str, str]:
        """Have the experts tensor `hf_name` (`...mlp.experts.gate_up_proj` / `.down_proj`) add a LoRA update
        unmerged (moe.py `Experts.add_adapter`); -> the HF names under which its factors A [E, r, in] and
        B [E, out, r] are then loaded."""
        resolved = self.resolve_hf_name(hf_name)
        module = None if resolved is None else resolved[2]
        if not isinstance(module, Experts):
            raise ValueError(f"add_expert_adapter: {hf_name!r} is not a fused expert tensor of this model")
        module.add_adapter(resolved[3], rank, scaling)
        return f"{hf_name}_lora_A", f"{hf_name}_lora_B"

    def _borrow(self, hf_name: str, name: str, param, module, param_name: str, tensor: torch.Tensor) -> None:
        device = self.rope_cache.device   # set by the runner's wake, on the engine's device
        if (tuple(tensor.shape), tensor.dtype, tensor.device) != (tuple(param.shape), param.dtype, device) or \
                not tensor.is_contiguous():
            raise ValueError(f"load_weights: {hf_name} was woken as borrowed, so it must arrive as the engine's own "
                             f"tensor: shape {tuple(param.shape)}, {param.dtype} on {device}, contiguous (got "
                             f"{tuple(tensor.shape)}, {tensor.dtype} on {tensor.device}, "
                             f"contiguous={tensor.is_contiguous()})")
        module._parameters[param_name] = nn.Parameter(tensor.detach(), requires_grad=False)
        if self.tie_word_embeddings and name == "model.embed_tokens.weight":
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def load_hf_weight(self, hf_name: str, tensor: torch.Tensor):
        """Copy one HF tensor into its (shard of a) parameter, or use it in place where that parameter was left
        unallocated for borrowing (ModelRunner.wake_weights); returns (our name, shard id), None if ignored."""
        resolved = self.resolve_hf_name(hf_name)
        if resolved is None:
            return None
        name, param, module, param_name, shard_id = resolved
        if param.is_meta:
            self._borrow(hf_name, name, param, module, param_name, tensor)
            return name, shard_id
        loader = getattr(module, "load", None)
        if loader is None:
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"load_weights: {hf_name} has shape {tuple(tensor.shape)}, expected "
                                 f"{tuple(param.shape)}")
            param.data.copy_(tensor.to(dtype=param.dtype, device=param.device))
        else:
            loader(param_name, tensor, shard_id)
        return name, shard_id

    def expected_weight_keys(self) -> set:
        """Every (parameter name, shard id) a complete load must fill."""
        keys = set()
        for name, _param in self.named_parameters():
            module = self.get_submodule(name.rpartition(".")[0])
            shard_ids = getattr(module, "parts", {None: None}).keys()
            keys.update((name, sid) for sid in shard_ids)
        return keys
