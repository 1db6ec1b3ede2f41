"""ModelRunner: the one object that owns the device work — decoder weights, paged KV cache, CUDA graphs.

Choices:
- The decoder is built once on the meta device; `wake_weights` materialises it (`to_empty`) and
  `sleep` sends it back to meta, so engine weights exist only during rollout and
  torch.cuda.memory_allocated() returns to its pre-wake level (caller-owned tensors aside).
- One KV tensor [layers, 2, num_blocks + 1, block_size, K, D]; the extra last block is a scratch block
  that padded CUDA-graph rows write to and read from. Size: `num_kv_blocks` if given, else whatever
  brings device usage to `gpu_memory_utilization` x total memory after weights, minus the measured
  activation peak of a worst-case prefill + sampling step (measured once, then reused every wake).
- CUDA graphs for decode at a few padded batch sizes, captured on KV wake-up sharing one memory pool,
  freed (graphs and pool) on sleep; capture time is kept in `last_capture_s`. Off with enforce_eager
  and off the GPU. Only the decoder forward is captured; LM head + sampling run eagerly.
- Copy-on-write block copies from the scheduler run as one indexed copy over all layers.
"""

from __future__ import annotations

import time

import torch

from hybridrl.models.decoder import TPDecoderForCausalLM, head_dim_of
from hybridrl.models.rope import cos_sin_cache
from hybridrl.models.tp_layers import tp_rank_size
from hybridrl.rollout.attention import AttentionContext
from hybridrl.rollout.sampler import sample
from hybridrl.rollout.scheduler import ScheduledBatch

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class ModelRunner:
    def __init__(self, hf_config, *, tp_group, device, dtype, block_size, max_num_seqs, max_num_batched_tokens,
                 max_model_len, enforce_eager):
        self.config, self.tp_group, self.device, self.dtype = hf_config, tp_group, torch.device(device), dtype
        self.block_size, self.max_num_seqs = block_size, max_num_seqs
        self.max_num_batched_tokens, self.max_model_len = max_num_batched_tokens, max_model_len
        self.is_cuda = self.device.type == "cuda"
        self.use_graphs = self.is_cuda and not enforce_eager
        self.use_triton = self.is_cuda and _triton_available()
        with torch.device("meta"):
            self.model = TPDecoderForCausalLM(hf_config, tp_group).to(dtype)
        attn = self.model.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, head_dim_of(hf_config)
        self.kv = None
        self.kv_caches = None
        self.num_blocks = 0
        self.graphs, self.graph_pool, self.graph_bufs = {}, None, None
        self.last_capture_s = 0.0
        self.activation_reserve = None
        self.weights_awake = False

    # ------------------------------------------------------------------ memory phases
    def wake_weights(self) -> None:
        if self.weights_awake:
            return
        self.model.to_empty(device=self.device)
        if self.model.tie_word_embeddings:
            self.model.lm_head.weight = self.model.model.embed_tokens.weight
        self.model.rope_cache = cos_sin_cache(self.config, self.head_dim, self.max_model_len, self.device)
        self.weights_awake = True

    def block_bytes(self) -> int:
        layers = self.config.num_hidden_layers
        return 2 * layers * self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def wake_kv(self, num_kv_blocks: int | None, gpu_memory_utilization: float) -> None:
        if self.kv is not None:
            return
        if num_kv_blocks is None:
            num_kv_blocks = self._blocks_from_memory(gpu_memory_utilization)
        L = self.config.num_hidden_layers
        self.kv = torch.zeros(L, 2, num_kv_blocks + 1, self.block_size, self.num_kv_heads, self.head_dim,
                              dtype=self.dtype, device=self.device)
        self.kv_caches = list(self.kv.unbind(0))
        self.num_blocks = num_kv_blocks
        if self.use_graphs:
            self._capture_graphs()

    def _blocks_from_memory(self, utilization: float) -> int:
        if not self.is_cuda:
            raise ValueError("num_kv_blocks must be given on CPU (gpu_memory_utilization sizes the cache on CUDA only)")
        if self.activation_reserve is None:
            self.activation_reserve = self._measure_activation_peak()
        free, total = torch.cuda.mem_get_info(self.device)
        budget = utilization * total - (total - free) - self.activation_reserve
        blocks = int(budget // self.block_bytes())
        if blocks < 1:
            raise ValueError(
                f"gpu_memory_utilization={utilization} leaves no room for the KV cache: {(total - free) / 2**30:.1f} "
                f"GiB of {total / 2**30:.1f} GiB already used, activation reserve "
                f"{self.activation_reserve / 2**30:.2f} GiB; raise it or free memory before wake_up")
        return blocks

    @torch.no_grad()
    def _measure_activation_peak(self) -> int:
        """Peak extra memory of a worst-case prefill step plus sampling max_num_seqs rows."""
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        T = min(self.max_num_batched_tokens, self.max_model_len * self.max_num_seqs)
        lens = [min(self.max_model_len, T - i) for i in range(0, T, self.max_model_len)]
        scratch = [torch.zeros(2, 1, self.block_size, self.num_kv_heads, self.head_dim, dtype=self.dtype,
                               device=self.device) for _ in range(self.config.num_hidden_layers)]
        ctx = AttentionContext(scratch, True, torch.zeros(T, dtype=torch.long, device=self.device),
                               seq_lens=lens, cached_lens=[0] * len(lens))
        ids = torch.zeros(T, dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])
        h = self.model(ids, pos, ctx)
        rows = min(self.max_num_seqs, 1024)
        logits = self.model.compute_logits(h[:1].expand(rows, -1).contiguous())
        ones = torch.ones(rows, device=self.device)
        sample(logits, ones, torch.full((rows,), 50, device=self.device), ones * 0.9)
        del h, logits, scratch
        peak = torch.cuda.max_memory_allocated(self.device) - base
        torch.cuda.empty_cache()
        return int(peak * 1.1) + (256 << 20)

    def sleep(self) -> None:
        self.graphs, self.graph_pool, self.graph_bufs = {}, None, None
        self.kv, self.kv_caches, self.num_blocks = None, None, 0
        if self.weights_awake:
            self.model.to_empty(device="meta")
            if self.model.tie_word_embeddings:
                self.model.lm_head.weight = self.model.model.embed_tokens.weight
            self.model.rope_cache = None
            self.weights_awake = False
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:  # cuBLAS workspaces live in the caching allocator (incl. the capture stream's)
                clear()
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ CUDA graphs
    def _scratch(self):
        return self.num_blocks, self.num_blocks * self.block_size  # scratch block id, its first slot

    @torch.no_grad()
    def _capture_graphs(self) -> None:
        t0 = time.perf_counter()
        max_bs = min(self.max_num_seqs, GRAPH_BATCH_SIZES[-1])
        sizes = [s for s in GRAPH_BATCH_SIZES if s <= max_bs]
        if sizes[-1] < max_bs:
            sizes.append(max_bs)
        max_blocks = -(-self.max_model_len // self.block_size)
        blk, slot = self._scratch()
        dev = self.device
        bufs = {
            "ids": torch.zeros(max_bs, dtype=torch.long, device=dev),
            "pos": torch.zeros(max_bs, dtype=torch.long, device=dev),
            "slots": torch.full((max_bs,), slot, dtype=torch.long, device=dev),
            "ctx_lens": torch.ones(max_bs, dtype=torch.int32, device=dev),
            "tables": torch.full((max_bs, max_blocks), blk, dtype=torch.int32, device=dev),
            "out": torch.zeros(max_bs, self.config.hidden_size, dtype=self.dtype, device=dev),
        }
        for bs in reversed(sizes):
            ctx = self._decode_ctx(bufs["slots"][:bs], bufs["tables"][:bs], bufs["ctx_lens"][:bs])
            bufs["out"][:bs] = self.model(bufs["ids"][:bs], bufs["pos"][:bs], ctx)  # warm-up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, self.graph_pool):
                bufs["out"][:bs] = self.model(bufs["ids"][:bs], bufs["pos"][:bs], ctx)
            if self.graph_pool is None:
                self.graph_pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(dev)
        self.graph_bufs = bufs
        self.last_capture_s = time.perf_counter() - t0

    def _decode_ctx(self, slots, tables, ctx_lens):
        return AttentionContext(self.kv_caches, False, slots, block_tables=tables, context_lens=ctx_lens,
                                use_triton=self.use_triton)

    # ------------------------------------------------------------------ one step
    def _copy_blocks(self, copies) -> None:
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        self.kv[:, :, dst] = self.kv[:, :, src]

    def _prefill_inputs(self, batch: ScheduledBatch):
        ids, pos, slots, lens, cached, tables = [], [], [], [], [], []
        bs = self.block_size
        for seq in batch.seqs:
            c = seq.num_cached_tokens
            ids.extend(seq.token_ids[c:])
            pos.extend(range(c, len(seq)))
            slots.extend(seq.block_table[p // bs] * bs + p % bs for p in range(c, len(seq)))
            lens.append(len(seq) - c)
            cached.append(c)
            tables.append(torch.tensor(seq.block_table, dtype=torch.int32, device=self.device) if c else None)
        t = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
        ctx = AttentionContext(self.kv_caches, True, t(slots), seq_lens=lens, cached_lens=cached,
                               prefill_block_tables=tables)
        last = torch.tensor(lens, device=self.device).cumsum(0) - 1
        return t(ids), t(pos), ctx, last

    def _decode_hidden(self, batch: ScheduledBatch):
        seqs, bs = batch.seqs, self.block_size
        B = len(seqs)
        ids = [s.token_ids[-1] for s in seqs]
        pos = [len(s) - 1 for s in seqs]
        slots = [s.block_table[(len(s) - 1) // bs] * bs + (len(s) - 1) % bs for s in seqs]
        width = max(len(s.block_table) for s in seqs)
        tables = torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], dtype=torch.int32)
        lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
        graph_bs = next((g for g in sorted(self.graphs) if g >= B), None)
        if graph_bs is None:
            t = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
            ctx = self._decode_ctx(t(slots), tables.to(self.device), lens.to(self.device))
            return self.model(t(ids), t(pos), ctx)
        buf = self.graph_bufs
        blk, slot = self._scratch()
        buf["ids"][:B] = torch.tensor(ids)
        buf["pos"][:B] = torch.tensor(pos)
        buf["slots"][:B] = torch.tensor(slots)
        buf["slots"][B:graph_bs] = slot
        buf["ctx_lens"][:B] = lens
        buf["ctx_lens"][B:graph_bs] = 1
        buf["tables"][:B, :width] = tables
        buf["tables"][B:graph_bs, 0] = blk
        self.graphs[graph_bs].replay()
        return buf["out"][:B]

    @torch.no_grad()
    def step(self, batch: ScheduledBatch, generator) -> tuple[list[int], list[float]]:
        if batch.block_copies:
            self._copy_blocks(batch.block_copies)
        if batch.is_prefill:
            ids, pos, ctx, last = self._prefill_inputs(batch)
            h = self.model(ids, pos, ctx)[last]
        else:
            h = self._decode_hidden(batch)
        logits = self.model.compute_logits(h)
        counts = [len(g) for g in batch.sample_groups]
        if any(c != 1 for c in counts):
            logits = logits.repeat_interleave(torch.tensor(counts, device=self.device), dim=0)
        flat = [s.params for g in batch.sample_groups for s in g]
        temp = torch.tensor([0.0 if p.greedy else p.temperature for p in flat], device=self.device)
        top_k = torch.tensor([p.top_k for p in flat], device=self.device)
        top_p = torch.tensor([p.top_p for p in flat], device=self.device)
        tokens, logprobs = sample(logits, temp, top_k, top_p, generator)
        return tokens.tolist(), logprobs.tolist()

    @property
    def tp_rank(self) -> int:
        return tp_rank_size(self.tp_group)[0]
