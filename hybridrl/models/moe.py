"""Mixture-of-experts block for the rollout decoder: a replicated top-k router and SwiGLU experts computed as
grouped GEMMs, split over tensor-parallel ranks by intermediate columns or, as an option, by whole experts.

Choices:
- Routing is HF's (models/qwen3_moe, models/mixtral): logits = x W_gate^T in the model dtype, softmax over all
  experts in fp32, top k, optional renormalisation, then the weights in the model dtype (Qwen3-MoE) or fp32
  (Mixtral) — see moe_config.py. The router weight is replicated: every TP rank routes the same (replicated)
  hidden states with the same weights, so all ranks pick the same experts without any exchange.
- Dispatch without a loop over tokens: the T·k (token, expert) assignments are sorted by expert (stable sort, so
  the order is deterministic), the hidden states gathered in that order, and each expert's rows are one
  contiguous slice whose end offsets come from `searchsorted` on the device. Experts then run as two grouped
  GEMMs (gate|up, down) over those slices. The outputs return to assignment order by the inverse permutation and
  are summed over the k assignments of each token (a reshape + sum, as HF's grouped_mm path: deterministic, no
  atomics, one rounding).
- Two backends compute the grouped GEMMs, picked per call from the device, dtype and shapes (`backend`):
  'grouped_mm' — torch's grouped matmul (`torch.nn.functional.grouped_mm`, else `torch._grouped_mm`) with the
  offsets on the device: no host synchronisation, so the decode step can be captured in a CUDA graph. Used on CUDA
  for bf16 on compute capability 9.0 and above (Hopper: the CUTLASS kernel), and on CPU where torch has the
  kernel, whenever every row stride is a multiple of 16 bytes (the kernel's requirement).
  'sorted' — the fallback that is correct everywhere: one matmul per non-empty expert slice, which needs the slice
  bounds on the host (one `.tolist()` a layer), so it is NOT CUDA-graph safe; `graph_safe(device, dtype)` says
  which backend a device gets, and the decoder turns CUDA graphs off where the fallback would run.
- Tensor parallelism (default): every rank holds every expert's slice of I/tp gate and up rows and the matching
  down columns, so a rank's output is a partial sum and the block ends in one all-reduce, like the dense MLP.
  Expert parallelism (`expert_parallel=True`): rank r holds experts [r·E/tp, (r+1)·E/tp) whole; assignments to
  other ranks' experts sort to the tail past the last offset (grouped_mm skips those rows; they are zeroed before
  the sum) and the same all-reduce combines the ranks. Tokens stay replicated across the TP ranks either way, so
  no all-to-all is needed.
- Weights arrive in transformers 5's fused 3-D layout: `experts.gate_up_proj` [E, 2I, H] (gate rows, then up
  rows) and `experts.down_proj` [E, H, I]. Under TP a rank's gate_up slice is two ranges of dim 1 (its gate rows
  and its up rows): its `shard_spec` is the 4-tuple (1, start, length, 2) — dim 1 seen as 2 equal blocks, the
  same range taken from each — which the resharder honours (hybrid/reshard.py) so a rank receives only its slice.
  The per-expert names of older checkpoints (`experts.<e>.gate_proj.weight`) are refused with that explanation:
  weights reach the engine from the actor's transformers-5 state dict, which has the fused layout.

- LoRA on the experts, unmerged (TP = 1 only: `add_adapter`): beside a base tensor W [E, out, in] (borrowed from the
  actor, hybrid/reshard.py) the block holds expert e's factors A_e [r, in] and B_e [out, r] as `<name>_lora_A`
  [E, r, in] and `<name>_lora_B` [E, out, r], and computes y = x W_e^T + scaling·(x A_e^T) B_e^T with the same
  grouped GEMMs over the same sorted slices (two more per adapted tensor, the same backend: CUDA-graph safety is
  unchanged). The rank is zero-padded to a multiple of 16 bytes (`padded_rank`), the grouped kernel's row-stride
  requirement; the padded rows and columns add nothing.

- Routing record (rollout routing replay): given the step's context, a block writes each token's k expert ids into
  the context's per-slot record (rollout/attention.py `record_experts`), at the token's KV-cache slot, so the record
  follows the KV cache: shared prompt blocks, copy-on-write, preemption and multi-turn continuations need nothing
  more. Ids are stored in `routing_dtype(E)` (uint8 up to 255 experts); an id >= E marks a token with no record.

Shape legend: T tokens, H hidden, E experts (local El), k experts per token, S = T·k assignments, I one expert's
intermediate size (local Il).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybridrl.models import fused
from hybridrl.models.tp_layers import ShardSpec, copy_shard, tp_rank_size

BACKENDS = ("auto", "grouped_mm", "sorted")
_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def padded_rank(rank: int, itemsize: int) -> int:
    """An unmerged expert adapter's rank as the engine holds it: rounded up to rows of a multiple of 16 bytes."""
    per = max(1, 16 // itemsize)
    return -(-rank // per) * per


def routing_dtype(num_experts: int) -> torch.dtype:
    """The compact integer type of recorded expert ids: its largest value (>= E) marks 'not recorded'."""
    return torch.uint8 if num_experts < 255 else torch.int16


def not_routed(num_experts: int) -> int:
    return torch.iinfo(routing_dtype(num_experts)).max


def grouped_mm_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's grouped matmul runs here without host synchronisation (see the module docstring)."""
    if _grouped_mm is None:
        return False
    if device.type == "cuda":
        return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) >= (9, 0)
    return device.type == "cpu"


def route(logits_TE: torch.Tensor, top_k: int, norm_topk_prob: bool, weights_fp32: bool):
    """-> (weights [T, k], expert ids [T, k]): softmax over all experts in fp32, then the top k (see Choices)."""
    probs = torch.softmax(logits_TE, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if weights_fp32 else weights.to(logits_TE.dtype)), ids


class Router(nn.Module):
    """The replicated gate: weight [E, H]."""

    def __init__(self, hidden: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden), requires_grad=False)

    def forward(self, x_TH):
        return F.linear(x_TH, self.weight)


class Experts(nn.Module):
    """This rank's experts: gate_up_proj [El, 2·Il, H] (gate rows, then up rows), down_proj [El, H, Il].
    forward(x [T, H], ids [T, k], weights [T, k]) -> this rank's partial sum [T, H] (not yet all-reduced)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, tp_group=None, expert_parallel=False):
        super().__init__()
        rank, size = tp_rank_size(tp_group)
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.tp_size, self.expert_parallel = size, expert_parallel
        if expert_parallel:
            if num_experts % size:
                raise ValueError(f"expert parallelism over {size} ranks must divide the {num_experts} experts")
            self.local_experts, self.local_inter = num_experts // size, intermediate
        else:
            if intermediate % size:
                raise ValueError(f"tensor_model_parallel_size={size} must divide the experts' intermediate size "
                                 f"{intermediate}")
            self.local_experts, self.local_inter = num_experts, intermediate // size
        self.first_expert = rank * self.local_experts if expert_parallel else 0
        self.inter_start = 0 if expert_parallel else rank * self.local_inter
        El, Il = self.local_experts, self.local_inter
        self.gate_up_proj = nn.Parameter(torch.empty(El, 2 * Il, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(El, hidden, Il), requires_grad=False)
        self.backend = "auto"
        self.adapters: dict[str, tuple[int, float]] = {}   # adapted tensor -> (rank received, scaling): unmerged LoRA

    # ------------------------------------------------------------------ weights
    def add_adapter(self, param_name: str, rank: int, scaling: float) -> None:
        """Hold LoRA factors for `param_name` (gate_up_proj or down_proj) and add their update unmerged (see the
        module docstring); they are parameters `<param_name>_lora_A` [E, r', in] and `_lora_B` [E, out, r'] (r' =
        padded_rank), created on the base tensor's device (meta while the engine sleeps) and loaded each wake."""
        if param_name not in ("gate_up_proj", "down_proj"):
            raise ValueError(f"experts.add_adapter: {param_name!r} is not an expert tensor (gate_up_proj, down_proj)")
        if self.tp_size != 1:
            raise ValueError("experts.add_adapter: unmerged expert adapters need the experts whole on one rank (TP = 1)")
        if self.adapters.get(param_name, (rank, scaling)) != (rank, scaling):
            raise ValueError(f"experts.add_adapter: {param_name} already holds an adapter of rank "
                             f"{self.adapters[param_name][0]}, scaling {self.adapters[param_name][1]}")
        base = getattr(self, param_name)
        E, out, inp = base.shape
        r = padded_rank(rank, base.dtype.itemsize)
        for suffix, shape in (("lora_A", (E, r, inp)), ("lora_B", (E, out, r))):
            self.register_parameter(f"{param_name}_{suffix}", nn.Parameter(
                torch.empty(shape, dtype=base.dtype, device=base.device), requires_grad=False))
        self.adapters[param_name] = (rank, float(scaling))

    def shard_spec(self, param_name, shard_id) -> ShardSpec | None:
        if self.tp_size == 1:
            return None
        if self.expert_parallel:
            return (0, self.first_expert, self.local_experts)
        if param_name == "gate_up_proj":
            return (1, self.inter_start, self.local_inter, 2)
        return (2, self.inter_start, self.local_inter)

    def load(self, param_name: str, tensor: torch.Tensor, shard_id=None) -> None:
        param = getattr(self, param_name)
        base, _, factor = param_name.partition("_lora_")
        if factor:   # an adapter factor of rank r into its zero-padded parameter
            dim = 1 if factor == "A" else 2
            rank = self.adapters[base][0]
            want = list(param.shape)
            want[dim] = rank
            if list(tensor.shape) != want:
                raise ValueError(f"load_weights: experts.{param_name} must have shape {tuple(want)} (got "
                                 f"{tuple(tensor.shape)})")
            param.data.zero_()
            param.data.narrow(dim, 0, rank).copy_(tensor)
            return
        if tensor.dim() != 3:
            raise ValueError(f"load_weights: experts.{param_name} must be the fused 3-D tensor of all experts "
                             f"(got shape {tuple(tensor.shape)})")
        copy_shard(param.data, tensor, self.shard_spec(param_name, shard_id), f"experts.{param_name}")

    # ------------------------------------------------------------------ compute
    def resolve_backend(self, device: torch.device, dtype: torch.dtype) -> str:
        if self.backend not in BACKENDS:
            raise ValueError(f"Experts.backend={self.backend!r}: must be one of {BACKENDS}")
        if self.backend != "auto":
            return self.backend
        # the kernel needs 16-byte aligned row strides in all three operands (adapter factors: padded_rank)
        aligned = all(n * dtype.itemsize % 16 == 0 for n in (self.hidden, self.local_inter))
        return "grouped_mm" if aligned and grouped_mm_available(device, dtype) else "sorted"

    def forward(self, x_TH, ids_Tk, weights_Tk, use_fused=False):
        T, k = ids_Tk.shape
        if T == 0:
            return torch.zeros_like(x_TH)
        backend = self.resolve_backend(x_TH.device, x_TH.dtype)
        El = self.local_experts
        ids_S = ids_Tk.reshape(-1)
        outside_S = None
        if self.expert_parallel:
            ids_S = ids_S - self.first_expert
            outside_S = (ids_S < 0) | (ids_S >= El)
            ids_S = ids_S.masked_fill(outside_S, El)  # sorts past every local expert
        sorted_S, perm_S = torch.sort(ids_S, stable=True)
        ends_E = torch.searchsorted(sorted_S, torch.arange(El, device=ids_S.device), right=True).to(torch.int32)
        x_SH = x_TH.index_select(0, perm_S // k)
        gu_S2I = self._adapted(x_SH, "gate_up_proj", ends_E, backend)
        if use_fused:
            act_SI = fused.silu_mul(gu_S2I)
        else:
            gate, up = gu_S2I.chunk(2, dim=-1)
            act_SI = F.silu(gate) * up
        y_SH = self._adapted(act_SI, "down_proj", ends_E, backend)
        if outside_S is not None:  # rows past the last offset are left unwritten by grouped_mm: may hold NaN
            y_SH = y_SH.masked_fill(outside_S.index_select(0, perm_S).unsqueeze(-1), 0.0)
        y_SH = y_SH * weights_Tk.reshape(-1).index_select(0, perm_S).unsqueeze(-1)
        unsorted = torch.empty_like(y_SH).index_copy_(0, perm_S, y_SH)
        return unsorted.view(T, k, -1).sum(dim=1).to(x_TH.dtype)

    def _adapted(self, x_SD, name, ends_E, backend):
        """x @ W_e^T for each expert's rows, plus scaling·(x A_e^T) B_e^T where `name` holds an unmerged adapter."""
        y = self._grouped(x_SD, getattr(self, name), ends_E, backend)
        if name not in self.adapters:
            return y
        t_Sr = self._grouped(x_SD, getattr(self, f"{name}_lora_A"), ends_E, backend)
        return y.add_(self._grouped(t_Sr, getattr(self, f"{name}_lora_B"), ends_E, backend),
                      alpha=self.adapters[name][1])

    @staticmethod
    def _grouped(x_SD, w_EOD, ends_E, backend):
        """y[rows of expert e] = x[rows of e] @ w[e]^T for the sorted rows; rows past ends[-1] are not computed."""
        if backend == "grouped_mm":
            return _grouped_mm(x_SD, w_EOD.transpose(-2, -1), offs=ends_E)
        out = x_SD.new_zeros(x_SD.shape[0], w_EOD.shape[1])
        start = 0
        for e, end in enumerate(ends_E.tolist()):  # the host sync that keeps this path out of CUDA graphs
            if end > start:
                out[start:end] = F.linear(x_SD[start:end], w_EOD[e])
            start = end
        return out


class SparseMoeBlock(nn.Module):
    """Router + experts + the TP all-reduce: x [T, H] -> [T, H]. Module names follow HF (`gate`, `experts`), so HF
    weight names resolve to these parameters unchanged."""

    def __init__(self, config, moe, tp_group=None, expert_parallel=False, moe_index: int = 0):
        super().__init__()
        self.tp_group = tp_group
        self.moe_index = moe_index  # this block's place among the model's MoE layers (the routing record's row)
        self.top_k, self.norm_topk_prob, self.weights_fp32 = moe.top_k, moe.norm_topk_prob, moe.weights_fp32
        self.gate = Router(config.hidden_size, moe.num_experts)
        self.experts = Experts(moe.num_experts, config.hidden_size, moe.intermediate, tp_group, expert_parallel)

    def forward(self, x_TH, use_fused=False, ctx=None):
        weights_Tk, ids_Tk = route(self.gate(x_TH), self.top_k, self.norm_topk_prob, self.weights_fp32)
        if ctx is not None:
            ctx.record_experts(self.moe_index, ids_Tk)
        y_TH = self.experts(x_TH, ids_Tk, weights_Tk, use_fused=use_fused)
        if self.tp_group is not None:
            dist.all_reduce(y_TH, group=self.tp_group)
        return y_TH

    def graph_safe(self, device: torch.device, dtype: torch.dtype) -> bool:
        return self.experts.resolve_backend(device, dtype) == "grouped_mm"
