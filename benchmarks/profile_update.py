"""Where the actor update's time goes, per micro-batch size (one GPU, random weights, no Ray).

Builds the actor as the trainer's worker does on one rank (1-rank process group, build_training_mesh,
workers.common.build_fsdp_model with the run plan's LoRA base dtype and optimizer kind, DataParallelPPOActor over
the default config's actor section with the plan's per-rank sizes) and runs one optimizer step over all --rows
rows of a synthetic GRPO batch (random in-vocab ids, no padding, random advantages; no old_log_probs, so the
update's own detached log-probs are the old ones, as the plan's on-policy default does), each prompt on --n
adjacent rows; --use-prefix-grouper and --use-liger resolve as the run plan resolves their keys.

Per configuration KIND:CKPT:MICRO[:FORWARD] (KIND = full, or loraR with alpha 2R; CKPT = ckpt | nockpt | keepN,
checkpointing with the last N decoder layers keeping their activations; MICRO = rows per micro-batch, or tokN for
token-budgeted micro-batches of at most N tokens (the plan's `use_dynamic_bsz` default on GPUs); FORWARD,
LoRA only: fused (default, the trainer's training/lora_linear.py) or peft (peft's own lora.Linear forward, for the
A/B)), e.g. lora64:ckpt:32,lora64:ckpt:32:peft,full:ckpt:16:
- a warm-up update that also carries the profiler window: --profile-micro micro-batches after the first
  --profile-skip (allocator and kernel choice are warm by then; one whole update of 128 micro-batches would be
  millions of profiler events), and separately its optimizer step. Per window: GPU kernel time grouped into
  gemm / attention / fsdp_copy / other (an MoE model adds moe_gemm and moe_dispatch: MOE_KERNELS), GPU busy time
  (union of kernel intervals) against the window's wall time, the torch ops that launched the GPU time (top_ops;
  on CPU the ops' own CPU time), for an MoE model the experts' ops by category (moe_op_s: MOE_OPS), and the host's
  side: time until it reached the window's end, time in calls that can block it
  (synchronize, memcpy: .item() / .cpu() wait there), the active rest, kernel launches and their API time. GPU
  idle while the host is mostly active means the host is the bottleneck (launch overhead per micro-batch); the
  profiler itself slows the host, so host numbers are upper bounds. The window's update is the warm-up: in the
  first configuration of a KIND its optimizer step is a new optimizer's first (AdamW state allocated there);
- --repeat timed updates (synchronized): seconds, seconds per micro-batch, tokens/s, achieved TFLOP/s, peak
  allocated memory (reset per configuration);
- how often the first decoder layer's attention ran forward per micro-batch (2 with recompute, 1 without):
  checkpointing was really toggled.
Consecutive configurations of one KIND share the model (checkpointing toggled in place); a new KIND frees the
old model first.

  PYTHONPATH=. python benchmarks/profile_update.py [--preset qwen2.5-7b] [--configs ...] [--out PATH]
  PYTHONPATH=. python benchmarks/profile_update.py --device cpu --preset dir:/tmp/tiny --rows 8 --prompt-len 16 \
      --response-len 16 --configs lora8:ckpt:4,lora8:nockpt:2 --out /tmp/update.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import device_facts  # noqa: E402

from hybridrl.plan.actor_plan import resolve_liger, resolve_prefix_grouper  # noqa: E402
from hybridrl.plan.run_plan import training_dtypes  # noqa: E402
from hybridrl.plan.sizing import shared_prompt_tokens  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402
from hybridrl.training.fsdp import decoder_blocks, recompute_on, recomputed_layers, set_recompute  # noqa: E402

DEFAULT_CONFIGS = "lora64:ckpt:32,lora64:nockpt:4,lora64:nockpt:8,lora64:nockpt:16,full:ckpt:16"
FLOP_ASSUMPTIONS = (
    "2 * params * tokens per forward-equivalent: the decoder's parameters (not the input embedding, a lookup) over "
    "the tokens it runs (decoder_tokens: every prompt + response token, each prompt once per micro-batch with "
    "shared prompts), the LM head's over the response tokens only (the actor computes logits only "
    "there); of an MoE layer's experts only the k of E a token is routed to (decoder_params is the active count, "
    "expert_params every expert); LoRA adapters and attention score/value FLOPs not counted. Forward-equivalents per "
    "update: full fine-tuning 3 (forward, input grads, weight grads), 4 with checkpointing (+ recompute); LoRA 2 "
    "(forward, input grads; no weight gradients of the frozen base), 3 with checkpointing")


@dataclass(frozen=True)
class UpdateConfig:
    name: str
    lora_rank: int          # 0: full fine-tuning
    checkpointing: bool
    micro: int              # rows per micro-batch (0: token-budgeted, see max_tokens)
    lora_forward: str = "fused"   # LoRA only: "fused" (training/lora_linear.py, what the trainer runs) or "peft"
    kept_layers: int = 0          # with checkpointing: the last decoder layers that keep their activations
    max_tokens: int | None = None   # token-budgeted micro-batches: at most this many tokens each
    unshard_once: bool = False      # ':once': blocks all-gathered once per mini-batch, not twice per micro-batch

    @classmethod
    def parse(cls, spec: str) -> UpdateConfig:
        parts = spec.split(":")
        once = parts[-1] == "once"
        if once:
            parts = parts[:-1]
        if len(parts) not in (3, 4):
            raise ValueError(f"{spec!r}: expected KIND:CKPT:MICRO[:FORWARD][:once]")
        kind, ckpt, micro, forward = (*parts, "fused")[:4]
        if kind != "full" and not (kind.startswith("lora") and kind[4:].isdigit()):
            raise ValueError(f"{spec!r}: KIND must be 'full' or 'loraR' (e.g. lora64)")
        kept = ckpt[4:] if ckpt.startswith("keep") else "0"
        if not (ckpt in ("ckpt", "nockpt") or (ckpt.startswith("keep") and kept.isdigit() and int(kept) > 0)):
            raise ValueError(f"{spec!r}: CKPT must be 'ckpt', 'nockpt' or 'keepN' (recompute all but the last N "
                             "layers)")
        budget = micro[3:] if micro.startswith("tok") else None
        if budget is not None and not (budget.isdigit() and int(budget) > 0):
            raise ValueError(f"{spec!r}: MICRO tokN needs a positive token budget N")
        if budget is None and (not micro.isdigit() or int(micro) < 1):
            raise ValueError(f"{spec!r}: MICRO must be a positive number of rows or tokN")
        if forward not in ("fused", "peft") or (kind == "full" and len(parts) == 4):
            raise ValueError(f"{spec!r}: FORWARD (LoRA only) must be 'fused' or 'peft'")
        return cls(spec, 0 if kind == "full" else int(kind[4:]), ckpt != "nockpt", 0 if budget else int(micro),
                   forward, int(kept), int(budget) if budget else None, once)

    def forward_equivalents(self, layers: int = 1) -> float:
        recomputed = (layers - self.kept_layers) / layers if self.checkpointing else 0.0
        return (2 if self.lora_rank else 3) + recomputed


# MoE models only (lower-cased substrings of CUDA kernel names; not checked on a GPU here, so plausible names):
# - moe_gemm: torch's grouped matmul (aten::_grouped_mm, which transformers' 'grouped_mm' experts call, forward and
#   backward): on SM90/SM100 a CUTLASS kernel `cutlass::device_kernel<GemmUniversal<GroupProblemShape<...>,
#   ...KernelPtrArrayTmaWarpSpecialized...>>` (ATen's native/cuda/GroupMM.cu) and its setup kernel
#   `at::cuda::detail::prepare_grouped_gemm_data`. Checked before gemm (the kernel is also "cutlass"). Where torch
#   falls back to a loop of per-expert mm (transformers' grouped_mm_fallback, ATen's fallback below SM90 or for
#   fp32), the kernels are plain GEMMs and land in gemm: MOE_OPS still counts them (by the op that issued them).
# - moe_dispatch: the router's top-k (`gatherTopK`, `sbtopk` / `mbtopk::...`), the sort by expert (cub
#   `DeviceRadixSort...`, `radixSortKVInPlace`, `bitonicSortKVInPlace`), tokens per expert (histc:
#   `kernelHistogram1D`, offsets: cumsum's `..._scan_...`), and the token permutation's gather / scatter in both
#   directions (`index_elementwise_kernel<..gpu_index_kernel..>`, `vectorized_gather_kernel`,
#   `indexing_backward_kernel`, `index_put_...`, `scatter_gather_elementwise_kernel`). Not index_select's
#   `indexSelect...` (the shared-prompt attention's K/V gather, GQA's repeat_interleave). Checked after fsdp_copy
#   (NCCL's AllGather names contain "gather") and gemm. The same kernels outside the MoE blocks count here too: the
#   log-prob head's gather, packing's cumsum, the embedding's backward sort (full fine-tuning only): small against
#   48 layers' dispatch in both directions.
MOE_KERNELS = {"moe_gemm": ("groupproblemshape", "ptrarray", "grouped_gemm", "groupedgemm", "grouped_mm",
                            "group_gemm"),
               "moe_dispatch": ("topk", "sort", "histogram", "_scan", "scan_", "scankernel", "index_elementwise",
                                "gpu_index_kernel", "index_put", "indexing_backward", "gather", "scatter")}


def kernel_category(name: str, moe: bool = False) -> str:
    """Attention, then GEMMs, before copies: CUTLASS kernel names carry their tile copies' types (`Copy_Atom`,
    `TiledCopy`), and FlashAttention's carry `cutlass::`."""
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if moe and any(s in n for s in MOE_KERNELS["moe_gemm"]):
        return "moe_gemm"
    if any(s in n for s in ("gemm", "sm90", "cutlass", "nvjet", "ampere", "xmma", "splitk", "cublas")):
        return "gemm"
    if any(s in n for s in ("nccl", "all_gather", "allgather", "reduce_scatter", "reducescatter", "chunk_cat",
                            "catarraybatchedcopy", "split_with_sizes", "memcpy", "memset", "copy")):
        return "fsdp_copy"
    if moe and any(s in n for s in MOE_KERNELS["moe_dispatch"]):
        return "moe_dispatch"
    return "other"


# MoE models only: the torch ops of the experts' work (profiler op names). An op belongs to the category of the
# outermost op of MOE_OPS around it (within one autograd node's backward: the walk stops at
# `autograd::engine::evaluate_function: ...`: a checkpointed layer's recompute runs inside the first backward node
# that unpacks a saved tensor, often the MoE block's IndexBackward0, whose own time is that recompute's host side),
# so the per-expert mm of a fallback loop count as moe_gemm; none under the embedding (its lookup and backward).
# moe_gemm: aten::_grouped_mm (torch's kernel, forward and its backward's two), transformers::grouped_mm_fallback
# (+ _backward). moe_dispatch: what routes the tokens and permutes them (transformers' grouped_mm_experts_forward:
# router top-k, sort by expert, histc + cumsum for the offsets, the gathers `x[perm // k]`, `w[perm]`,
# `out[inv_perm]`, `inv_perm[perm] = arange` and their backward's index_put_ / scatter). Not index_select and
# repeat_interleave: the attention's (shared-prompt K/V gather, GQA). cumsum also builds packing's offsets (once
# per forward) and gather the log-prob head's pick (once per micro-batch): small beside 48 MoE layers.
MOE_OPS = {"moe_gemm": ("aten::_grouped_mm", "aten::grouped_mm", "transformers::grouped_mm_fallback",
                        "transformers::grouped_mm_fallback_backward"),
           "moe_dispatch": ("aten::topk", "aten::sort", "aten::argsort", "aten::histc", "aten::bincount",
                            "aten::cumsum", "aten::index", "aten::index_put_", "aten::_index_put_impl_",
                            "aten::index_add_", "aten::scatter", "aten::scatter_",
                            "aten::scatter_add_", "aten::gather")}
_OP_CATEGORY = {op: cat for cat, ops in MOE_OPS.items() for op in ops}
_NOT_MOE = ("aten::embedding", "aten::embedding_backward", "aten::embedding_dense_backward")


def moe_op_category(event) -> str | None:
    """The MOE_OPS category of a profiler FunctionEvent (see MOE_OPS), None outside the experts' work."""
    found = None
    while event is not None and not event.name.startswith("autograd::engine::evaluate_function"):
        if event.name in _NOT_MOE:
            return None
        found = _OP_CATEGORY.get(event.name, found)
        event = event.cpu_parent
    return found


def moe_ops(prof, per: int, gpu: bool, count: int = 60) -> dict:
    """The window's op time by MOE_OPS category (GPU: the ops' own kernels' time; CPU: their own CPU time) with
    the rest, and the ops counted there (op name, category; ms and calls per micro-batch)."""
    by_cat, by_op = defaultdict(float), defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CPU:
            continue
        us = (getattr(ev, "self_device_time_total", 0) or 0) if gpu else ev.self_cpu_time_total
        cat = moe_op_category(ev)
        by_cat[cat or "rest"] += us / 1e6
        if cat:
            by_op[(ev.name, cat)][0] += us / 1e6
            by_op[(ev.name, cat)][1] += 1
    top = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:count]
    return {"time": "gpu" if gpu else "cpu", "s_by_category": dict(by_cat),
            "per_micro_batch_s_by_category": {k: v / per for k, v in by_cat.items()},
            "ops": [{"op": op, "category": cat, "ms": v[0] * 1e3 / per, "calls": v[1] / per}
                    for (op, cat), v in top]}


def busy_seconds(intervals: list[tuple[int, int]]) -> float:
    """Length of the union of [start, end) nanosecond intervals (kernels of several streams overlap)."""
    total, end_so_far = 0, None
    for start, end in sorted(intervals):
        if end_so_far is None or start > end_so_far:
            total += end - start
            end_so_far = end
        elif end > end_so_far:
            total += end - end_so_far
            end_so_far = end
    return total / 1e9


def summarize_window(prof, wall_s: float, host_s: float, micro_batches: int, gpu: bool, moe: bool = False) -> dict:
    """One profiler window: host time until the window's end was reached (before its closing synchronize), time in
    CUDA calls that can block the host (synchronize, memcpy: .item() and .cpu() wait in one of them; the closing
    synchronize included), the host's active rest, kernel launches, the top ops (GPU: their kernels' time; CPU:
    their own CPU time) and for an MoE model its experts' ops (moe_ops); on GPUs also kernel time per category,
    busy time (union of kernel intervals) and idle time against the wall clock."""
    by_cat, by_kernel = defaultdict(float), defaultdict(lambda: [0.0, 0])
    intervals, launches, launch_s, blocked_s = [], 0, 0.0, 0.0
    for ev in prof.profiler.kineto_results.events():
        name, dur = ev.name(), ev.duration_ns() / 1e9
        if ev.device_type() == torch.autograd.DeviceType.CUDA:
            intervals.append((ev.start_ns(), ev.end_ns()))
            by_cat[kernel_category(name, moe)] += dur
            by_kernel[name][0] += dur
            by_kernel[name][1] += 1
        elif name.startswith("cu") and "LaunchKernel" in name:   # runtime / driver API calls
            launches += 1
            launch_s += dur
        elif name.startswith("cu") and ("Synchronize" in name or "Memcpy" in name):
            blocked_s += dur
    per = max(micro_batches, 1)
    out = {"micro_batches": micro_batches, "wall_s": wall_s, "host_s": host_s, "host_blocked_s": blocked_s,
           "host_active_s": max(wall_s - blocked_s, 0.0), "kernel_launches": launches, "launch_api_s": launch_s}
    out["top_ops"] = top_ops(prof, per, gpu)
    if moe:
        out["moe_op_s"] = moe_ops(prof, per, gpu)
    if gpu:
        busy = busy_seconds(intervals)
        top = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:60]
        out.update(gpu_busy_s=busy, gpu_idle_s=max(wall_s - busy, 0.0), kernels=len(intervals),
                   kernel_s_by_category=dict(by_cat),
                   per_micro_batch={"wall_s": wall_s / per, "gpu_busy_s": busy / per, "kernels": len(intervals) / per,
                                    "kernel_s_by_category": {k: v / per for k, v in by_cat.items()}},
                   top_kernels=[{"name": k[:160], "s": v[0], "calls": v[1]} for k, v in top])
    return out


def top_ops(prof, per: int, gpu: bool = True, count: int = 40) -> list[dict]:
    """The torch ops that launched the window's GPU time, grouped by op and input shapes: GPU ms (its own kernels,
    not its children's) and calls per micro-batch. Which Python code issues many small kernels shows up here as
    an op with a high call count (a cast, a copy, an add) and its shapes. On CPU (gpu False) the ops' own CPU ms
    instead (cpu_ms)."""
    rows, key = [], "gpu_ms" if gpu else "cpu_ms"
    for ev in prof.key_averages(group_by_input_shape=True):
        us = (getattr(ev, "self_device_time_total", 0) or 0) if gpu else ev.self_cpu_time_total
        if us > 0 and ev.device_type == torch.autograd.DeviceType.CPU:
            rows.append({"op": ev.key, "shapes": str(ev.input_shapes)[:160], key: us / 1e3 / per,
                         "calls": ev.count / per})
    return sorted(rows, key=lambda r: -r[key])[:count]


class ProfileWindow:
    """Profiles micro-batches [start, start + count) of the next update (ending early at its optimizer step), and
    that optimizer step, by wrapping the actor's `_forward_micro_batch` and `_optimizer_step` on the instance."""

    def __init__(self, actor, device: torch.device, start: int, count: int, moe: bool = False):
        self.actor, self.device, self.start, self.count, self.moe = actor, device, start, count, moe
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.seen, self.prof, self.t0, self.result = 0, None, 0.0, {}
        forward, step = actor._forward_micro_batch, actor._optimizer_step

        def forward_hook(*a, **k):
            if self.seen == self.start:
                self._begin()
            elif self.seen == self.start + self.count and self.prof is not None:
                self.result["micro_batch_window"] = self._end(self.count)
            self.seen += 1
            return forward(*a, **k)

        def step_hook(*a, **k):
            if self.prof is not None:
                self.result["micro_batch_window"] = self._end(self.seen - self.start)
            self._begin()
            out = step(*a, **k)
            self.result["optimizer_step"] = self._end(0)
            return out

        actor._forward_micro_batch, actor._optimizer_step = forward_hook, step_hook

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _begin(self):
        self._sync()
        self.prof = profile(activities=self.activities, record_shapes=True)
        self.prof.start()
        self.t0 = time.perf_counter()

    def _end(self, micro_batches: int) -> dict:
        host_s = time.perf_counter() - self.t0
        self._sync()
        wall_s = time.perf_counter() - self.t0
        self.prof.stop()
        out = summarize_window(self.prof, wall_s, host_s, micro_batches, self.device.type == "cuda", self.moe)
        self.prof = None
        return out

    def remove(self):
        """Unwrap the actor; a window left open by an exception (e.g. out of memory) is stopped."""
        for name in ("_forward_micro_batch", "_optimizer_step"):
            vars(self.actor).pop(name, None)
        if self.prof is not None:
            self.prof.stop()
            self.prof = None


def response_lengths(rows: int, response_len: int, mean_len: float | None, seed: int = 0) -> list[int]:
    """Every row response_len tokens, or (mean_len set) long-tailed lengths: exponential with that mean, capped at
    response_len (the cap's share is what reaches the limit), at least 1."""
    if mean_len is None:
        return [response_len] * rows
    g = torch.Generator().manual_seed(seed + 1)
    draws = torch.empty(rows).exponential_(1.0 / mean_len, generator=g)
    return [int(min(max(1.0, float(x)), response_len)) for x in draws]


def synthetic_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0, n: int = 1,
                    lengths: list[int] | None = None) -> DataProto:
    """A GRPO batch (prompts exactly prompt_len tokens); each prompt on n adjacent rows (its samples), each row its
    own response: response_len tokens each, or `lengths[i]` tokens right-padded to response_len (masked out)."""
    g = torch.Generator().manual_seed(seed)
    seq = prompt_len + response_len
    input_ids = torch.randint(0, vocab, (rows, seq), generator=g)
    input_ids[:, :prompt_len] = input_ids[::n, :prompt_len].repeat_interleave(n, 0)[:rows]
    lengths = lengths or [response_len] * rows
    response_mask = (torch.arange(response_len)[None, :] < torch.tensor(lengths)[:, None]).float()
    attention_mask = torch.cat([torch.ones(rows, prompt_len), response_mask], 1).long()
    return DataProto.from_dict({
        "prompts": input_ids[:, :prompt_len], "responses": input_ids[:, prompt_len:], "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": torch.arange(seq).expand(rows, seq).clone(),
        "response_mask": response_mask,
        "advantages": torch.randn(rows, response_len, generator=g) * response_mask}, meta_info={"temperature": 1.0})


def model_dir_for(preset: str, workdir: Path) -> Path:
    if preset.startswith("dir:"):
        return Path(preset[4:])
    from hybridrl.assets.tiny_model import write_size_preset

    model_dir = workdir / "models" / preset
    if not (model_dir / "config.json").exists() or not any(model_dir.glob("*.safetensors")):
        write_size_preset(model_dir, preset, weights=True)
    return model_dir


def flop_params(module) -> dict[str, int]:
    """The base model's parameters that do matmuls: the decoder's (no input embedding, no LoRA adapters) and the
    LM head's (a tied head is the embedding matrix). Of an MoE model's experts (transformers' fused
    `mlp.experts.*` tensors) a token runs k of E: decoder_params counts that share (the active parameters, as
    ModelShape.decoder_active_params), expert_params all of them."""
    from hybridrl.models.moe_config import moe_config

    head = module.get_output_embeddings().weight
    dense = experts = 0
    for n, p in module.named_parameters():
        if p is head or "lora_" in n or "embed_tokens" in n:
            continue
        if ".experts." in n:
            experts += p.numel()
        else:
            dense += p.numel()
    moe = moe_config(module.config)
    active = experts * moe.top_k // moe.num_experts if experts and moe is not None else experts
    return {"decoder_params": dense + active, "expert_params": experts, "head_params": head.numel()}


class ActorBench:
    """The actor of one KIND (full or LoRA rank r) and its optimizer, as ActorRolloutRefWorker.init_model builds
    them; `actor_for(cfg, rows)` sets checkpointing in place and returns an actor with that micro-batch size."""

    def __init__(self, model_dir: Path, lora_rank: int, checkpointing: bool, mesh, device: torch.device,
                 liger: bool, share_prompts: bool):
        from hybridrl.config import load_config
        from hybridrl.training.fsdp import FSDPDtypes
        from hybridrl.training.moe import is_moe
        from hybridrl.workers.common import build_fsdp_model

        overrides = [f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.model.lora_rank={lora_rank}",
                     f"actor_rollout_ref.model.lora_alpha={2 * max(lora_rank, 1)}"]
        self.config = load_config(overrides=overrides).actor_rollout_ref
        self.device = device
        _, base_dtype, fused = training_dtypes(str(self.config.actor.fsdp_config.model_dtype), lora_rank > 0,
                                               device.type)
        t0 = time.perf_counter()
        self.module, self.optimizer, self.scheduler = build_fsdp_model(
            self.config.model, FSDPDtypes.of(self.config.actor.fsdp_config), self.config.actor.optim, mesh, device,
            trainable=True,
            lora_base_dtype=base_dtype, fused_optimizer=fused, gradient_checkpointing=checkpointing, liger=liger,
            use_varlen_attention=bool(self.config.model.use_remove_padding) or share_prompts)
        self.share_prompts = share_prompts
        self.moe = is_moe(self.module.config)
        self.build_s = time.perf_counter() - t0
        self.facts = {"lora_base_dtype": base_dtype, "fused_optimizer": fused, "use_liger": liger,
                      "use_prefix_grouper": share_prompts, "moe": self.moe,
                      "experts_implementation": getattr(self.module.config, "_experts_implementation", None),
                      "model_dtype": str(self.config.actor.fsdp_config.model_dtype),
                      **flop_params(self.module),
                      "trainable_params": sum(p.numel() for p in self.module.parameters() if p.requires_grad)}

    def actor_for(self, cfg: UpdateConfig, rows: int):
        from hybridrl.training.actor import DataParallelPPOActor
        from hybridrl.training.micro_batches import UpdateBatches

        set_recompute(self.module, cfg.checkpointing, cfg.kept_layers)
        if cfg.lora_rank:
            set_lora_forward(self.module, cfg.lora_forward)
        return DataParallelPPOActor(self.config.actor, self.module, self.optimizer, self.scheduler,
                                    batches=UpdateBatches(rows, cfg.micro or None, cfg.max_tokens, cfg.unshard_once),
                                    use_remove_padding=bool(self.config.model.use_remove_padding),
                                    share_prompts=self.share_prompts)


def set_lora_forward(module, forward: str) -> None:
    """Switch the LoRA linears in place between the fused forward and peft's own (the fused class's base), for
    the A/B."""
    from hybridrl.training.lora import _lora_layers
    from hybridrl.training.lora_linear import use_fused_forward

    layers = list(_lora_layers(module).values())
    if forward == "fused":
        use_fused_forward(layers)
        return
    for m in layers:
        if type(m).__name__ == "FusedLoraLinear":
            m.__class__ = type(m).__bases__[0]


def first_layer_forward_counter(module):
    """Counts forwards of the first decoder block's first submodule (its attention). Not the block's own hook:
    transformers checkpoints the block's `forward`, so hooks on the block stay outside the recompute, while its
    submodules run again in backward."""
    calls = [0]
    handle = next(decoder_blocks(module)[0].children()).register_forward_hook(
        lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


def run_config(bench: ActorBench, cfg: UpdateConfig, batch: DataProto, args) -> dict:
    device = bench.device
    actor = bench.actor_for(cfg, args.rows)
    if cfg.max_tokens:
        from hybridrl.training.micro_batches import make_micro_batches

        n_micro = len(make_micro_batches(batch, True, None, cfg.max_tokens, share_prompts=bench.share_prompts)[1])
    else:
        n_micro = math.ceil(args.rows / cfg.micro)
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def update() -> float:
        sync()
        t0 = time.perf_counter()
        actor.update_policy(batch)
        sync()
        return time.perf_counter() - t0

    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    resident_gb = torch.cuda.memory_allocated(device) / 2**30 if cuda else None
    start = min(args.profile_skip, n_micro - 1)
    window = ProfileWindow(actor, device, start, min(args.profile_micro, n_micro - start), bench.moe)
    calls, handle = first_layer_forward_counter(bench.module)
    try:
        warmup_s = update()
    finally:
        handle.remove()
        window.remove()
    times = [update() for _ in range(args.repeat)]
    mean_s = sum(times) / len(times)
    response_tokens = int(batch.batch["response_mask"].sum())
    tokens = args.rows * args.prompt_len + response_tokens
    computed = tokens   # through the decoder: each prompt once per micro-batch with shared prompts
    if cfg.max_tokens and bench.share_prompts:   # each micro-batch holds whole prompt groups
        computed = response_tokens + (args.rows // args.n) * args.prompt_len
    elif bench.share_prompts:
        full, rest = divmod(args.rows, cfg.micro)
        computed = full * shared_prompt_tokens(cfg.micro, args.n, args.prompt_len, args.response_len) + (
            shared_prompt_tokens(rest, args.n, args.prompt_len, args.response_len) if rest else 0)
    layers = len(decoder_blocks(bench.module))
    flops = cfg.forward_equivalents(layers) * 2 * (bench.facts["decoder_params"] * computed
                                             + bench.facts["head_params"] * response_tokens)
    return {"lora_rank": cfg.lora_rank, "lora_forward": cfg.lora_forward if cfg.lora_rank else None,
            "checkpointing": cfg.checkpointing, "micro_batch_rows": cfg.micro or None,
            "micro_batch_max_tokens": cfg.max_tokens, "unshard_once": cfg.unshard_once, "response_tokens": response_tokens,
            "micro_batches": n_micro, "is_gradient_checkpointing": recompute_on(bench.module),
            "recomputed_layers": recomputed_layers(bench.module), "layers": layers,
            "first_layer_forwards_per_micro_batch": calls[0] / n_micro,
            "update_s": mean_s, "update_s_each": times, "s_per_micro_batch": mean_s / n_micro,
            "tokens_per_s": tokens / mean_s, "decoder_tokens": computed,
            "forward_equivalents": cfg.forward_equivalents(layers),
            "tflops": flops / mean_s / 1e12, "warmup_profiled_update_s": warmup_s,
            "resident_allocated_gb": resident_gb,
            "peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
            "profile": window.result}


def init_single_rank(device: torch.device) -> bool:
    """A 1-rank default process group (nccl on GPUs, gloo on CPU) unless one exists; True when created here."""
    if dist.is_initialized():
        return False
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    return True


def free(bench: ActorBench | None, device: torch.device) -> None:
    """Drop the model and its optimizer (and whatever a failed update left behind) and return the memory."""
    if bench is not None:
        del bench.module, bench.optimizer, bench.scheduler
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen2.5-7b", help="hybridrl size preset, or 'dir:PATH' for an existing model")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="KIND:CKPT:MICRO,... (see the module docstring)")
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=256)
    p.add_argument("--mean-response-len", type=float, default=None,
                   help="long-tailed response lengths (exponential with this mean, capped at --response-len); "
                        "unset: every response --response-len tokens")
    p.add_argument("--repeat", type=int, default=2, help="timed updates per configuration (after the warm-up)")
    p.add_argument("--profile-skip", type=int, default=1, help="micro-batches of the warm-up before the window")
    p.add_argument("--profile-micro", type=int, default=2, help="micro-batches in the profiler window")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--use-liger", default="auto", choices=["auto", "true", "false"],
                   help="Liger's fused kernels, resolved as the run plan resolves actor_rollout_ref.model.use_liger "
                        "(they patch the architecture's classes for the whole process: A/B in separate runs)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt: adjacent rows of the batch share a prompt")
    p.add_argument("--use-prefix-grouper", default="auto", choices=["auto", "true", "false"],
                   help="shared-prompt forwards, resolved as the run plan resolves actor.use_prefix_grouper")
    p.add_argument("--workdir", default="/tmp/hybridrl_bench")
    p.add_argument("--experts-implementation", default=None,
                   help="an MoE model's experts: transformers' experts interface name, e.g. its own 'grouped_mm' "
                        "for the A/B (default: what the actor loads, hybridrl's training/moe_experts.py)")
    p.add_argument("--out", default="benchmarks/results/profile_update.json")
    args = p.parse_args(argv)
    if args.experts_implementation:
        import functools

        import hybridrl.training.fsdp as fsdp
        from hybridrl.training.moe import load_kwargs

        fsdp.load_kwargs = functools.partial(load_kwargs, experts_implementation=args.experts_implementation)
    configs = [UpdateConfig.parse(s) for s in args.configs.split(",") if s]

    from hybridrl.seeding import seed_everything
    from hybridrl.training.fsdp import build_training_mesh, load_hf_config

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    model_dir = model_dir_for(args.preset, Path(args.workdir))
    created = init_single_rank(device)
    seed_everything(0)
    mesh = build_training_mesh(1, -1, device.type)
    hf_config = load_hf_config(str(model_dir))
    vocab = hf_config.vocab_size
    liger_choice: list[str] = []
    liger = resolve_liger({"auto": "auto", "true": True, "false": False}[args.use_liger], device.type,
                          hf_config.model_type, liger_choice)
    share_choice: list[str] = []
    share = resolve_prefix_grouper({"auto": "auto", "true": True, "false": False}[args.use_prefix_grouper],
                                   device.type, args.n, 1, share_choice)
    batch = synthetic_batch(args.rows, args.prompt_len, args.response_len, vocab, n=args.n,
                            lengths=response_lengths(args.rows, args.response_len, args.mean_response_len))
    result = {"benchmark": "profile_update", "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
              "device": device_facts(), "preset": args.preset,
              "workload": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")},
              "flop_assumptions": FLOP_ASSUMPTIONS, "use_liger": liger_choice, "use_prefix_grouper": share_choice,
              "models": {}, "configs": {}}
    out = Path(args.out)
    bench, kind = None, None
    try:
        for cfg in configs:
            try:
                if kind != cfg.lora_rank:
                    free(bench, device)
                    bench, kind = None, None
                    bench = ActorBench(model_dir, cfg.lora_rank, cfg.checkpointing, mesh, device, liger, share)
                    kind = cfg.lora_rank
                    result["models"][f"lora{kind}" if kind else "full"] = {**bench.facts, "build_s": bench.build_s}
                entry = run_config(bench, cfg, batch, args)
                line = (f"{entry['update_s']:.2f} s, {entry['s_per_micro_batch']:.3f} s/micro-batch, "
                        f"{entry['tflops']:.1f} TFLOP/s, peak {entry['peak_allocated_gb']} GiB")
            except Exception as e:  # e.g. out of memory: a result; the model is rebuilt for the next configuration
                entry = {"error": f"{type(e).__name__}: {str(e)[-2000:]}", "traceback": traceback.format_exc()[-4000:]}
                line, kind = entry["error"][:300], None
            if kind is None:
                free(bench, device)
                bench = None
            result["configs"][cfg.name] = entry
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))  # after each configuration: partial results survive
            print(f"[update] {cfg.name}: {line}", flush=True)
    finally:
        free(bench, device)
        if created:
            dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
