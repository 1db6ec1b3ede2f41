"""ModelRunner: the one object that owns the device work — decoder weights, paged KV cache, CUDA graphs.

Choices:
- The decoder is built once on the meta device; `wake_weights` materialises it (`to_empty`) and
  `sleep` sends it back to meta, so engine weights exist only during rollout and
  torch.cuda.memory_allocated() returns to its pre-wake level (caller-owned tensors aside).
- Borrowed weights: a parameter the caller holds whole in the engine's layout and dtype (the hybrid engine's
  actor tensors at TP = 1 without FSDP sharding, hybrid/reshard.py) is not allocated on wake; the parameter is
  pointed at the caller's tensor instead of a copy, and sleep drops the reference. The caller guarantees the
  tensor is neither freed nor written while the engine is awake. The KV budget charges the engine only for the
  weights it allocated; the decode floor counts every weight it reads.
- One KV tensor [layers, 2, num_blocks + 1, block_size, K, D]; the extra last block is a scratch block
  that padded CUDA-graph rows write to and read from. Size: `num_kv_blocks` (the run plan's need) capped on
  GPUs by the ceiling `kv_budget_bytes` (vLLM's per-instance meaning of `gpu_memory_utilization`: the
  engine's weights, KV and activations within that fraction of the GPU, and the KV within what is free);
  the activation peak is that of a worst-case prefill + sampling step (measured once, then reused every
  wake); without `num_kv_blocks`, the ceiling itself.
- CUDA graphs for decode at a few padded batch sizes, each captured the first time a step needs it (after
  a KV wake-up), sharing one memory pool, freed (graphs and pool) on sleep; capture time is summed in
  `last_capture_s`; only a bucket's first capture in the process runs the step eagerly before capturing. Off
  with enforce_eager and off the GPU. Only the decoder forward is captured; LM head + sampling run eagerly.
- Decode inputs without per-step tensor building: ids/positions/slots/context lengths (and, for a
  lookahead step, where each row's input token sits in the previous step's samples) go into one pinned
  int64 host buffer [5, rows] and the block tables into a pinned [rows, max_blocks] buffer whose rows
  are rewritten only where a sequence's table changed (a new block every block_size tokens, a different
  sequence in the row, or copy-on-write); two non_blocking H2D copies a step feed the graph's input
  buffers directly. The host buffers come in two sets used alternately, so step t+1's inputs can be
  written while step t's copies are still queued.
- A step is `launch` (inputs, forward, sampling, and a non_blocking copy of the sampled tokens into
  pinned memory, then an event) and `read` (wait for that event). Nothing in `launch` of a decode step
  waits for the device (the sampler path is chosen from host-side SamplingParams flags), so the engine
  can launch step t+1 — its input tokens gathered on the device from step t's samples — before it reads
  step t (async scheduling, engine.py). `step` = launch + read.
- Cascade decode (rollout/shared_prefix.py): each decode step's rows that share leading blocks are found from their
  block tables (recomputed only when a row's table list is replaced or blocks were copied); where the cascade pays
  (its rule reads the GPU's L2 size) the step runs the graph variant of its bucket with the shared-prefix kernels,
  whose groups travel in three more rows of the step's int64 input buffer. The same groups give the step's floor its
  K/V tokens, a shared block once (`StepHandle.kv_tokens`).
- Copy-on-write block copies from the scheduler run as one indexed copy over all layers.
- A verify step (speculative decoding, a batch with `drafts`) is a decode step with one row per query token: a
  sequence with k drafts takes k + 1 rows (its last token, then each draft) at consecutive positions, each with
  the context up to itself. Every row's K/V is stored before any row attends, so row j sees the drafts before it
  and nothing after: the plain decode path (kernels and CUDA graph buckets) computes the causal multi-token step.
  The cost is that a sequence's K/V is read once per row. spec_verify.verify_drafts accepts on the logits; the
  step is read synchronously (a [B, k + 1] result, never launched ahead).
- Routing record (`record_routed_experts`, MoE models): one [MoE layers, slots, k] tensor of expert ids beside the
  KV cache (the same slots, and the same scratch block; copied with the KV blocks on copy-on-write), written by the
  MoE blocks in every forward (models/moe.py). `experts_of(seq)` gathers a sequence's record on the device (no
  host sync) before its blocks are freed; `block_bytes` counts the record, so the KV budget does too.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hybridrl.models import fused
from hybridrl.models.decoder import TPDecoderForCausalLM, head_dim_of
from hybridrl.models.moe import routing_dtype
from hybridrl.models.moe_config import moe_config
from hybridrl.models.rope import cos_sin_cache
from hybridrl.models.tp_layers import tp_rank_size
from hybridrl.models.varlen_attention import flash_available
from hybridrl.rollout.attention import AttentionContext, prefill_chunks
from hybridrl.rollout.config import EngineConfig
from hybridrl.rollout.sampler import sample
from hybridrl.rollout.scheduler import ScheduledBatch
from hybridrl.rollout.shared_prefix import (
    PrefixGroups,
    SharedPrefix,
    cascade_switched_off,
    find_prefix_groups,
    prefix_members,
    use_cascade,
)
from hybridrl.rollout.spec_verify import verify_drafts


@dataclass
class _HostStepBuffers:
    """One set of pinned host buffers for a step (two sets alternate, see the module docstring)."""
    meta: torch.Tensor       # [8, rows] int64: token ids, positions, slots, context lengths, feed rows, and the
                             # shared prefixes (tokens a row; each group's first row; its rows)
    tables: torch.Tensor     # [rows, max_blocks] int32
    tokens: torch.Tensor     # [rows] sampled ids, copied back from the device
    logprobs: torch.Tensor   # [rows]
    row_lists: list          # the block_table list each table row was copied from
    row_lens: list


@dataclass
class TokenFeed:
    """Input tokens of a lookahead decode step: row i's token is tokens[rows[i]] (the previous step's samples)."""
    tokens: torch.Tensor
    rows: list[int]


@dataclass
class StepHandle:
    kind: str                # "prefill" | "decode"
    tokens: torch.Tensor     # [n] on the device
    logprobs: torch.Tensor
    host: _HostStepBuffers | None   # where the samples are copied to (CUDA), else None
    event: object            # CUDA event after that copy, else None
    n: int
    kv_tokens: int = 0       # a decode step's context tokens whose K/V it must read (its bandwidth floor): every
                             # sequence's, a block that several share (a prompt's, for its samples) once


GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def _triton_available(device) -> bool:
    """Triton paged decode attention: on CUDA when triton imports (HYBRIDRL_FUSED does not switch it)."""
    return fused._triton_ok() and device.type == "cuda"


def kv_budget_bytes(utilization: float, total: int, free: int, engine_weight_bytes: int,
                    activation_reserve: int) -> int:
    """Bytes the KV cache may take on wake. `gpu_memory_utilization` keeps vLLM's per-instance meaning: this
    engine's own memory (its weights, KV and activation peak) stays within utilization x total; memory others
    hold on the same GPU (a hybrid worker's training state, another process) is not charged to it, but the KV and
    the activation peak must fit in what is free."""
    return int(min(utilization * total - engine_weight_bytes, free) - activation_reserve)


class ModelRunner:
    def __init__(self, hf_config, config: EngineConfig, *, tp_group, device):
        """`config`: resolved (EngineConfig.for_model), so max_model_len is set."""
        self.config, self.hf_config, self.tp_group, self.device = config, hf_config, tp_group, torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.use_graphs = self.is_cuda and not config.enforce_eager
        self.use_triton = _triton_available(self.device) and fused.head_dim_fits(head_dim_of(hf_config))
        with torch.device("meta"):
            self.model = TPDecoderForCausalLM(hf_config, tp_group, max_model_len=config.max_model_len).to(config.dtype)
        self.use_graphs = self.use_graphs and self.model.cuda_graph_safe(self.device, config.dtype)  # MoE fallback syncs
        attn = self.model.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, head_dim_of(hf_config)
        # prefills of mixed lengths or over cached tokens: one varlen call per layer (rollout/attention.py)
        self.prefill_varlen = flash_available(self.device, config.dtype, self.head_dim)
        self.moe = moe_config(hf_config)
        if config.record_routed_experts and (self.moe is None or not self.moe.num_sparse):
            raise ValueError(f"rollout engine: record_routed_experts=True (actor.router_replay.mode=R3) needs an MoE "
                             f"model; model_type {hf_config.model_type!r} has no MoE layers")
        self.routing = None   # [MoE layers, slots, k] while the KV cache is awake and experts are recorded
        self.kv = None
        self.kv_caches = None
        self.num_blocks = 0
        self.graphs, self.graph_pool, self.graph_out, self.graph_sizes = {}, None, None, []
        self.warmed: set[tuple] = set()   # (bucket, cascade) captured once in this process: kernels compiled
        self._param_cache = None
        self._free_step_buffers()
        # host seconds launching / waiting for steps, and decode steps run with cascade attention (engine stats)
        self.counters = dict.fromkeys(("prefill_launch_s", "prefill_wait_s", "decode_launch_s", "decode_wait_s",
                                       "num_cascade_steps"), 0.0)
        # cascade decode: rows a prefix group's program attends together (0: off — no Triton path, more than 32 q
        # heads per kv head, or HYBRIDRL_CASCADE=0), and the groups of the last batch seen (rollout/shared_prefix.py),
        # which also give a step's floor the K/V its rows share (`StepHandle.kv_tokens`)
        self._group_members = prefix_members(hf_config.num_attention_heads // hf_config.num_key_value_heads)
        cascade = self.use_triton and not cascade_switched_off() and self._group_members >= 2
        self.cascade_members = self._group_members if cascade else 0
        self._prefix_tables, self._prefix = [], None
        self._kv_token_layer_bytes = 2 * self.num_kv_heads * self.head_dim * config.dtype.itemsize
        self._l2_bytes = torch.cuda.get_device_properties(self.device).L2_cache_size if self.is_cuda else 0
        self.last_capture_s = 0.0
        self.activation_reserve = None
        self.weights_awake = False
        self.borrowed: frozenset[str] = frozenset()   # parameters that are the caller's tensors while awake
        self.decode_step_floor_s = None   # set on KV wake where the GPU's peaks are known

    # ------------------------------------------------------------------ memory phases
    def wake_weights(self, borrowed: frozenset[str] = frozenset()) -> None:
        """Allocate the weights, except the parameters named in `borrowed` (our names): they stay on the meta
        device until `load_hf_weight` points them at the caller's own tensors."""
        if self.weights_awake:
            return
        held = [(module, leaf, module._parameters.pop(leaf)) for module, leaf in map(self._owner, borrowed)]
        self.model.to_empty(device=self.device)
        for module, leaf, param in held:
            module._parameters[leaf] = param
        self.borrowed = borrowed
        if self.model.tie_word_embeddings:
            self.model.lm_head.weight = self.model.model.embed_tokens.weight
        self.model.rope_cache = cos_sin_cache(self.hf_config, self.head_dim, self.config.max_model_len, self.device)
        self.weights_awake = True

    def block_bytes(self) -> int:
        layers, bs = self.hf_config.num_hidden_layers, self.config.block_size
        kv = 2 * layers * bs * self.num_kv_heads * self.head_dim * self.config.dtype.itemsize
        if not self.config.record_routed_experts:
            return kv
        return kv + self.moe.num_sparse * bs * self.moe.top_k * routing_dtype(self.moe.num_experts).itemsize

    def wake_kv(self, num_kv_blocks: int | None) -> None:
        if self.kv is not None:
            return
        utilization = self.config.gpu_memory_utilization
        if num_kv_blocks is None:
            num_kv_blocks = self._blocks_from_memory(utilization)
        elif self.is_cuda:  # the planned need, never above the utilization ceiling
            num_kv_blocks = min(num_kv_blocks, self._blocks_from_memory(utilization))
        L = self.hf_config.num_hidden_layers
        self.kv = torch.zeros(L, 2, num_kv_blocks + 1, self.config.block_size, self.num_kv_heads, self.head_dim,
                              dtype=self.config.dtype, device=self.device)
        self.kv_caches = list(self.kv.unbind(0))
        if self.config.record_routed_experts:
            m = self.moe
            self.routing = torch.zeros(m.num_sparse, (num_kv_blocks + 1) * self.config.block_size, m.top_k,
                                       dtype=routing_dtype(m.num_experts), device=self.device)
        self.num_blocks = num_kv_blocks
        self.decode_step_floor_s = self._decode_floor_fn()
        self._alloc_step_buffers()
        if self.use_graphs:
            self._set_graph_buckets()

    def _owner(self, name: str) -> tuple[nn.Module, str]:
        module_name, _, leaf = name.rpartition(".")
        return self.model.get_submodule(module_name), leaf

    def _weight_bytes(self, own: bool = False) -> int:
        """Bytes of the weights a decode step reads; `own`: only those the engine allocated (not borrowed)."""
        skip = {id(self.model.get_parameter(n)) for n in self.borrowed} if own else set()
        return sum(t.numel() * t.element_size() for t in (*self.model.parameters(), *self.model.buffers())
                   if id(t) not in skip)

    def _decode_floor_fn(self):
        """(context tokens whose K/V a decode step must read) -> the seconds it cannot beat on this GPU: its weights
        read once plus those tokens' K/V, over the datasheet HBM bandwidth; None off the GPU or for unknown GPUs. The
        caller counts a block that several sequences share once (StepHandle.kv_tokens)."""
        from hybridrl.device_peaks import peaks_of

        peaks = peaks_of(torch.cuda.get_device_name(self.device)) if self.is_cuda else None
        if peaks is None:
            return None
        weights = self._weight_bytes()
        kv_token = self.block_bytes() / self.config.block_size
        return lambda context: (weights + context * kv_token) / peaks.hbm_bytes_per_s

    def _blocks_from_memory(self, utilization: float) -> int:
        if not self.is_cuda:
            raise ValueError("num_kv_blocks must be given on CPU (gpu_memory_utilization sizes the cache on CUDA only)")
        if self.activation_reserve is None:
            self.activation_reserve = self._measure_activation_peak()
        free, total = torch.cuda.mem_get_info(self.device)
        weights = self._weight_bytes(own=True)   # borrowed weights are the caller's memory (see kv_budget_bytes)
        blocks = kv_budget_bytes(utilization, total, free, weights, self.activation_reserve) // self.block_bytes()
        if blocks < 1:
            gib = 2**30
            raise ValueError(
                f"no room for the KV cache: gpu_memory_utilization={utilization} x {total / gib:.1f} GiB allows the "
                f"engine {utilization * total / gib:.1f} GiB, its weights take {weights / gib:.1f} GiB and its "
                f"activation reserve {self.activation_reserve / gib:.2f} GiB; {free / gib:.1f} GiB of the GPU is free "
                "(the rest held by others, e.g. training state not offloaded). Raise gpu_memory_utilization or free "
                "memory before wake_up")
        return int(blocks)

    @torch.no_grad()
    def _measure_activation_peak(self) -> int:
        """Peak extra memory of a worst-case prefill step plus sampling max_decode_rows rows."""
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        T = min(self.config.max_num_batched_tokens, self.config.max_model_len * self.config.max_num_seqs)
        lens = [min(self.config.max_model_len, T - i) for i in range(0, T, self.config.max_model_len)]
        scratch = [torch.zeros(2, 1, self.config.block_size, self.num_kv_heads, self.head_dim,
                               dtype=self.config.dtype, device=self.device)
                   for _ in range(self.hf_config.num_hidden_layers)]
        ctx = AttentionContext(scratch, True, torch.zeros(T, dtype=torch.long, device=self.device),
                               seq_lens=lens, cached_lens=[0] * len(lens))
        ids = torch.zeros(T, dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])
        h = self.model(ids, pos, ctx)
        rows = min(self.config.max_decode_rows, 1024)
        logits = self.model.compute_logits(h[:1].expand(rows, -1).contiguous())
        ones = torch.ones(rows, device=self.device)
        sample(logits, ones, torch.full((rows,), 50, device=self.device), ones * 0.9)  # the sort path
        sample(logits, ones, ones, ones, flags=(False, False, False))  # the plain path (noise tensor)
        del h, logits, scratch
        peak = torch.cuda.max_memory_allocated(self.device) - base
        torch.cuda.empty_cache()
        return int(peak * 1.1) + (256 << 20)

    def sleep(self, clear_workspaces: bool = True) -> None:
        """Free the KV cache, graphs and weights; `clear_workspaces` false keeps cuBLAS's workspaces, which another
        thread training meanwhile may be using (the early update)."""
        self.graphs, self.graph_pool, self.graph_out, self.graph_sizes = {}, None, None, []
        self._param_cache = None
        self._free_step_buffers()
        self.kv, self.kv_caches, self.num_blocks, self.routing = None, None, 0, None
        self.decode_step_floor_s = None
        if self.weights_awake:
            self.model.to_empty(device="meta")
            if self.model.tie_word_embeddings:
                self.model.lm_head.weight = self.model.model.embed_tokens.weight
            self.model.rope_cache = None
            self.weights_awake, self.borrowed = False, frozenset()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None) if clear_workspaces else None
            if clear is not None:  # cuBLAS workspaces live in the caching allocator (incl. the capture stream's)
                clear()
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ step inputs (host + device buffers)
    def _alloc_step_buffers(self) -> None:
        """Pinned host staging + device buffers for decode inputs, allocated on KV wake-up.

        meta rows: 0 token ids, 1 positions, 2 slots, 3 context lengths, 4 feed rows, 5-7 the shared prefixes of a
        cascade step (int64, one H2D copy a step);
        tables: [rows, max blocks] int32, updated in place on the host only where a row changed.
        The host buffers are rewritten for step t+1 only after step t's tokens were read (a sync that
        follows the non_blocking copies in stream order), so a copy never reads a half-written buffer."""
        rows = self.config.max_decode_rows
        max_blocks = -(-self.config.max_model_len // self.config.block_size)
        pin = self.is_cuda
        blk, slot = self._scratch()
        self._host_sets = []
        for _ in range(2):
            hs = _HostStepBuffers(torch.zeros(8, rows, dtype=torch.long, pin_memory=pin),
                                  torch.zeros(rows, max_blocks, dtype=torch.int32, pin_memory=pin),
                                  torch.zeros(rows, dtype=torch.long, pin_memory=pin),
                                  torch.zeros(rows, dtype=torch.float32, pin_memory=pin), [None] * rows, [0] * rows)
            hs.meta.numpy()[2], hs.meta.numpy()[3], hs.tables.numpy()[:, 0] = slot, 1, blk
            self._host_sets.append(hs)
        self._launches = 0
        self.d_meta = torch.zeros(8, rows, dtype=torch.long, device=self.device)
        self.d_tables = torch.zeros(rows, max_blocks, dtype=torch.int32, device=self.device)
        self.d_meta.copy_(self._host_sets[0].meta)
        self.d_tables.copy_(self._host_sets[0].tables)

    def _free_step_buffers(self) -> None:
        self._host_sets, self.d_meta, self.d_tables = [], None, None

    # ------------------------------------------------------------------ CUDA graphs
    def _scratch(self):
        return self.num_blocks, self.num_blocks * self.config.block_size  # scratch block id, its first slot

    def _set_graph_buckets(self) -> None:
        """Set up the graph buckets; each is captured the first time a decode step needs it (`_capture`), so a
        wake costs only the buckets the rollout uses (a GRPO batch that decodes at full width uses a few)."""
        max_bs = min(self.config.max_decode_rows, GRAPH_BATCH_SIZES[-1])
        sizes = [s for s in GRAPH_BATCH_SIZES if s <= max_bs]
        if sizes[-1] < max_bs:
            sizes.append(max_bs)
        self.graph_out = torch.zeros(max_bs, self.hf_config.hidden_size, dtype=self.config.dtype, device=self.device)
        self.graph_sizes = sizes
        self.last_capture_s = 0.0

    @torch.no_grad()
    def _capture(self, bs: int, cascade: bool) -> None:
        """Capture the decode graph of bucket `bs` on the step's own inputs (already in the device buffers). The
        first capture of a bucket in this process runs the step eagerly first (its kernels compile outside the
        capture); later ones (every rollout recaptures: sleep frees the graphs) go straight to capture, which saved
        0.1 s of a long-tail rollout's 0.3 s of captures (benchmarks/results/long_tail). Either way the replay that
        follows computes the step; padded rows touch only the scratch block."""
        t0 = time.perf_counter()
        ids, pos, ctx = self._decode_args(bs, cascade)
        if (bs, cascade) not in self.warmed:
            self.graph_out[:bs] = self.model(ids, pos, ctx)
            self.warmed.add((bs, cascade))
        graph = torch.cuda.CUDAGraph()
        # thread_local: the early update may be training on another thread meanwhile, whose CUDA calls must not
        # count as this capture's (global mode would fail the capture on them)
        with torch.cuda.graph(graph, self.graph_pool, capture_error_mode="thread_local"):
            self.graph_out[:bs] = self.model(ids, pos, ctx)
        if self.graph_pool is None:
            self.graph_pool = graph.pool()
        self.graphs[bs, cascade] = graph
        self.last_capture_s += time.perf_counter() - t0

    def _decode_args(self, rows: int, cascade: bool = False):
        m, groups = self.d_meta, max(1, rows // 2)
        prefix = SharedPrefix(m[5, :rows], m[6, :groups], m[7, :groups]) if cascade else None
        ctx = AttentionContext(self.kv_caches, False, m[2, :rows], block_tables=self.d_tables[:rows],
                               context_lens=m[3, :rows], use_triton=self.use_triton, shared_prefix=prefix,
                               routed_experts=self.routing)
        return m[0, :rows], m[1, :rows], ctx

    def _prefix_groups(self, batch: ScheduledBatch, seqs, lens) -> PrefixGroups | None:
        """The shared prefixes of a decode step's rows (rollout/shared_prefix.py), where the cascade or the floor
        uses them (not for verify steps). Recomputed only when a row's block table is another list than at the last
        computation (the block manager makes a new list whenever it allocates, frees or trims; the lists kept here
        cannot be reused meanwhile) or blocks were copied on write (replaced in place): blocks appended as sequences
        grow never move a shared prefix."""
        if batch.drafts is not None or not (self.cascade_members or self.decode_step_floor_s is not None):
            return None
        tables = [s.block_table for s in seqs]
        if (batch.block_copies or len(tables) != len(self._prefix_tables)
                or not all(map(operator.is_, tables, self._prefix_tables))):
            self._prefix = find_prefix_groups(tables, lens, self.config.block_size, self._group_members)
            self._prefix_tables = tables
        return self._prefix

    def _cascade(self, found: PrefixGroups | None, B: int, meta, rows: int) -> bool:
        """Whether this decode step reads shared prefixes once per group; if so their rows of `meta` are written."""
        if not self.cascade_members or found is None or not use_cascade(found, self._kv_token_layer_bytes,
                                                                        self._l2_bytes):
            return False
        groups = max(1, rows // 2)
        meta[5, :B], meta[5, B:rows] = found.lens, 0
        meta[6:8, :groups] = 0
        if found.groups:
            meta[6:8, :len(found.groups)] = np.asarray(found.groups, dtype=np.int64).T
        return True

    # ------------------------------------------------------------------ one step
    def _copy_blocks(self, copies) -> None:
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        self.kv[:, :, dst] = self.kv[:, :, src]
        if self.routing is not None:
            record = self.routing.view(self.routing.shape[0], -1, self.config.block_size, self.routing.shape[-1])
            record[:, dst] = record[:, src]

    def experts_of(self, seq) -> torch.Tensor:
        """[len(seq) - 1, MoE layers, k] on the device: the experts each position but the last (never run through
        the model) was routed to, gathered from the routing record before the sequence's blocks are freed."""
        bs = self.config.block_size
        p = np.arange(len(seq) - 1)
        slots = torch.from_numpy(np.asarray(seq.block_table, dtype=np.int64)[p // bs] * bs + p % bs)
        return self.routing[:, slots.to(self.device, non_blocking=True)].transpose(0, 1)

    def _prefill_inputs(self, batch: ScheduledBatch):
        ids, pos, slots, lens, cached, key_slots = [], [], [], [], [], []
        bs = self.config.block_size
        for seq in batch.seqs:
            c, n = seq.num_cached_tokens, len(seq)
            ids.extend(seq.token_ids[c:])
            p = np.arange(n)
            keys = np.asarray(seq.block_table, dtype=np.int64)[p // bs] * bs + p % bs  # every position's slot
            key_slots.append(keys)
            slots.append(keys[c:])
            pos.append(p[c:])
            lens.append(n - c)
            cached.append(c)
        t = lambda x: torch.from_numpy(x).to(self.device, non_blocking=True)  # noqa: E731
        varlen = self.prefill_varlen and (any(cached) or len(set(lens)) > 1)
        tables = None if varlen or not any(cached) else [
            torch.tensor(s.block_table, dtype=torch.int32, device=self.device) if c else None
            for s, c in zip(batch.seqs, cached)]
        ctx = AttentionContext(self.kv_caches, True, t(np.concatenate(slots)), seq_lens=lens, cached_lens=cached,
                               prefill_block_tables=tables, routed_experts=self.routing,
                               prefill_chunks=prefill_chunks(lens, cached, key_slots, self.config.max_num_batched_tokens,
                                                             self.device) if varlen else None)
        last = t(np.cumsum(lens) - 1)
        return t(np.asarray(ids, dtype=np.int64)), t(np.concatenate(pos)), ctx, last

    @staticmethod
    def _verify_rows(batch: ScheduledBatch):
        """A verify step's rows: (sequence, input token, context length) for its last token and each draft."""
        seqs, toks, lens = [], [], []
        for s, draft in zip(batch.seqs, batch.drafts):
            n = len(s)
            seqs += [s] * (len(draft) + 1)
            toks += [s.token_ids[-1], *draft]
            lens += range(n, n + len(draft) + 1)
        return seqs, toks, lens

    def _decode_hidden(self, batch: ScheduledBatch, hs: _HostStepBuffers, feed):
        """The decode step's hidden states, and the context tokens whose K/V it must read (its floor's input)."""
        bs = self.config.block_size
        if batch.drafts is None:
            seqs = batch.seqs
            lens = [len(s.token_ids) for s in seqs]
            toks = None if feed is not None else [s.token_ids[-1] for s in seqs]
        else:
            seqs, toks, lens = self._verify_rows(batch)
        B = len(seqs)
        graph_bs = next((g for g in self.graph_sizes if g >= B), None)
        rows = graph_bs or B
        meta, tab = hs.meta.numpy(), hs.tables.numpy()
        if feed is None:
            meta[0, :B] = toks
        else:  # the last token is a placeholder: row i's token is sample feed.rows[i] of the step before
            meta[4, :B] = feed.rows
        meta[1, :B] = pos = [n - 1 for n in lens]
        meta[2, :B] = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, pos)]
        meta[3, :B] = lens
        row_lists, row_lens = hs.row_lists, hs.row_lens
        if batch.block_copies:  # copy-on-write replaced entries in place: re-copy every row
            row_lists[:] = [None] * len(row_lists)
        for i, s in enumerate(seqs):
            bt = s.block_table
            if row_lists[i] is not bt:
                tab[i, :len(bt)] = bt
                row_lists[i], row_lens[i] = bt, len(bt)
            elif row_lens[i] != len(bt):  # blocks appended since this row was written
                tab[i, row_lens[i]:len(bt)] = bt[row_lens[i]:]
                row_lens[i] = len(bt)
        found = self._prefix_groups(batch, seqs, lens)
        kv_tokens = (sum(lens) if batch.drafts is None else sum(len(s.token_ids) for s in batch.seqs)) \
            - (found.repeated_tokens if found is not None else 0)
        cascade = self._cascade(found, B, meta, rows)
        if rows > B:  # padded graph rows: read and write the scratch block only
            blk, slot = self._scratch()
            meta[0, B:rows], meta[1, B:rows], meta[2, B:rows], meta[3, B:rows] = 0, 0, slot, 1
            tab[B:rows, 0] = blk
            row_lists[B:rows] = [None] * (rows - B)
        self.d_meta.copy_(hs.meta, non_blocking=True)
        self.d_tables[:rows].copy_(hs.tables[:rows], non_blocking=True)
        if feed is not None:  # gathered on the device: no wait for the previous step
            self.d_meta[0, :B] = feed.tokens[self.d_meta[4, :B]]
        self.counters["num_cascade_steps"] += cascade
        if graph_bs is None:  # eager: only the batch's block-table width (the CPU reference gathers all of it),
            ids, pos, ctx = self._decode_args(B, cascade)   # made contiguous once here, not by every layer's kernel
            ctx.block_tables = ctx.block_tables[:, :max(row_lens[:B])].contiguous()
            return self.model(ids, pos, ctx), kv_tokens
        if (graph_bs, cascade) not in self.graphs:
            self._capture(graph_bs, cascade)
        self.graphs[graph_bs, cascade].replay()
        return self.graph_out[:B], kv_tokens

    def _sampling_tensors(self, flat, params):
        """Per-row temperature/top-k/top-p and host-side flags (no device sync). With one SamplingParams
        for the whole batch (what generate passes) the tensors are built once per generate call."""
        V = self.hf_config.vocab_size
        if params is not None:
            key = (params.greedy, params.temperature, params.top_k, params.top_p)
            if self._param_cache is None or self._param_cache[0] != key:
                rows = self.config.max_decode_rows
                dev = self.device
                temp = torch.full((rows,), 0.0 if params.greedy else params.temperature, device=dev)
                flags = (params.greedy, 0 < params.top_k < V, params.top_p < 1)
                self._param_cache = (key, temp, torch.full((rows,), params.top_k, device=dev),
                                     torch.full((rows,), params.top_p, device=dev), flags)
            _, temp, top_k, top_p, flags = self._param_cache
            n = len(flat)
            if n <= temp.shape[0]:
                return temp[:n], top_k[:n], top_p[:n], flags
            flat_params = [params] * n
        else:
            flat_params = [s.params for s in flat]
        temp = torch.tensor([0.0 if p.greedy else p.temperature for p in flat_params], device=self.device)
        top_k = torch.tensor([p.top_k for p in flat_params], device=self.device)
        top_p = torch.tensor([p.top_p for p in flat_params], device=self.device)
        flags = (all(p.greedy for p in flat_params), any(0 < p.top_k < V for p in flat_params),
                 any(p.top_p < 1 for p in flat_params))
        return temp, top_k, top_p, flags

    @torch.no_grad()
    def launch(self, batch: ScheduledBatch, generator, params=None, feed: TokenFeed | None = None) -> StepHandle:
        """Enqueue one prefill or decode step; `params`: the SamplingParams every sequence of the batch uses, if
        one; `feed`: for a decode step launched before the previous one was read, where its input tokens are."""
        t0 = time.perf_counter()
        hs = self._host_sets[self._launches % 2] if self._host_sets else None
        self._launches += 1
        if batch.block_copies:
            self._copy_blocks(batch.block_copies)
        if batch.is_prefill:
            if feed is not None:
                raise ValueError("a prefill step takes its tokens from the host, not from a TokenFeed")
            ids, pos, ctx, last = self._prefill_inputs(batch)
            h, kv_tokens = self.model(ids, pos, ctx)[last], 0
        else:
            h, kv_tokens = self._decode_hidden(batch, hs, feed)
        logits = self.model.compute_logits(h)
        if batch.is_prefill:  # a prompt's logits row, sampled once for each of its samples (decode rows: one each)
            counts = [len(g) for g in batch.sample_groups]
            if any(c != 1 for c in counts):
                logits = logits.repeat_interleave(torch.tensor(counts, device=self.device), dim=0)
        if params is not None:
            flat = range(logits.shape[0])
        elif batch.drafts is not None:
            flat = [s for s, d in zip(batch.seqs, batch.drafts) for _ in range(len(d) + 1)]
        else:
            flat = [s for g in batch.sample_groups for s in g]
        temp, top_k, top_p, flags = self._sampling_tensors(flat, params)
        if batch.drafts is not None:
            tokens, logprobs = verify_drafts(logits, batch.drafts, temp, top_k, top_p, generator, flags=flags)
        else:
            tokens, logprobs = sample(logits, temp, top_k, top_p, generator, flags=flags)
        n = tokens.shape[0]
        event = None
        # async scheduling reads step t after launching t+1: its samples must be copied out behind an event,
        # since a plain .tolist() would wait for t+1 too (off = the measured sync path); a verify step is read
        # before anything else is launched
        if self.config.async_scheduling and self.is_cuda and hs is not None and n <= hs.tokens.shape[0] \
                and batch.drafts is None:
            hs.tokens[:n].copy_(tokens, non_blocking=True)
            hs.logprobs[:n].copy_(logprobs, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        kind = "prefill" if batch.is_prefill else "decode"
        self.counters[f"{kind}_launch_s"] += time.perf_counter() - t0
        return StepHandle(kind, tokens, logprobs, hs if event is not None else None, event, n, kv_tokens)

    def read(self, handle: StepHandle) -> tuple[list[int], list[float]]:
        """Wait for a launched step's samples: (token ids, log-probs), one per sampled sequence."""
        t0 = time.perf_counter()
        if handle.event is not None:
            handle.event.synchronize()
            out = handle.host.tokens[:handle.n].tolist(), handle.host.logprobs[:handle.n].tolist()
        else:
            out = handle.tokens.tolist(), handle.logprobs.tolist()
        self.counters[f"{handle.kind}_wait_s"] += time.perf_counter() - t0
        return out

    def step(self, batch: ScheduledBatch, generator, params=None) -> tuple[list[int], list[float]]:
        return self.read(self.launch(batch, generator, params))

    @property
    def tp_rank(self) -> int:
        return tp_rank_size(self.tp_group)[0]
