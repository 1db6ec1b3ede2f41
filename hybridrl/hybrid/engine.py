"""The hybrid engine: one context manager per rollout that owns the memory order of a step.

Entry (hybrid, scheme B):
  1. drop gradients (set_to_none) — they are dead between update and next backward;
  2. optimizer state → CPU if optimizer_offload;
  3. engine weights wake (empty), FSDP shards are streamed into them tensor by tensor (see reshard.py) — so no moment
     holds a second full copy of the model beyond the tensor in flight; with `borrow_weights` the tensors the actor
     already holds whole in the engine's dtype are not allocated at all: the engine uses them in place;
  4. FSDP params → CPU if param_offload (after the stream, which reads them);
  5. KV cache allocated last: weights first, then KV, the order that avoids the well-known wake-up OOM.
The switch is timed both ways: `timing_s/switch_to_rollout` (end of training to an engine ready to prefill:
wake, reshard, offload, KV allocation; CUDA graphs are captured at their first decode step and reported as
`rollout/cuda_graph_capture_s`) and `timing_s/switch_to_train` (sleep, cache release, parameters back), each also
split into its parts (`timing_s/switch_to_rollout/release_training_cache`, `.../wake_weights`, `.../reshard`,
`.../wake_kv`, the offloads where on; `timing_s/switch_to_train/sleep`, `.../release_engine_cache`).
Exit: engine sleeps (KV + engine weights freed, prefix cache reset), cached blocks returned to the allocator,
offloaded params come back (log-prob needs them); optimizer state comes back at the update's first optimizer step
(`before_update`, called by the updater after the backward).

Scheme A (`hybrid_engine: false`, the "FSDP + separate vLLM" baseline): the engine wakes once and stays resident with
its own weights and KV; after every actor update its weights are re-synced from the FSDP shards. Same code path for
the data flow, so the two schemes differ only in memory lifetime — what the benchmarks compare.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from hybridrl.hybrid.memory import track_phase
from hybridrl.hybrid.reshard import FSDPToTPResharder


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _empty_cache(device: torch.device):
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _Laps:
    """Times the parts of a switch: each call records the seconds since the last under `prefix + part`, after a
    device sync (the parts are mostly allocator and copy work the host waits for anyway)."""

    def __init__(self, device: torch.device, metrics: dict, prefix: str):
        self.device, self.metrics, self.prefix = device, metrics, prefix
        _sync(device)
        self.t = time.perf_counter()

    def __call__(self, part: str) -> None:
        _sync(self.device)
        now = time.perf_counter()
        self.metrics[self.prefix + part] = now - self.t
        self.t = now


class HybridEngine:
    def __init__(self, module, optimizer, engine, *, device: torch.device, dtype: torch.dtype,
                 hybrid: bool = True, param_offload: bool = False, optimizer_offload: bool = False,
                 reshard_strategy: str = "slice", borrow_weights: bool = False):
        if borrow_weights and (not hybrid or param_offload):
            raise ValueError("HybridEngine: borrow_weights needs the hybrid scheme without param_offload (a resident "
                             "engine must hold copies; offloaded parameters leave the GPU during the rollout)")
        self.module, self.optimizer, self.engine = module, optimizer, engine
        self.device, self.hybrid = device, hybrid
        self.param_offload, self.optimizer_offload = param_offload, optimizer_offload
        self.resharder = FSDPToTPResharder(module, engine, dtype, device, strategy=reshard_strategy,
                                           borrow=borrow_weights)
        self._resident_ready = False
        self._weights_stale = True
        self._optimizer_on_cpu = False

    # ------------------------------------------------------------------ phases
    @contextmanager
    def rollout(self, metrics: dict, num_kv_blocks: int | None = None, beside_training: bool = False):
        """Yields the awake engine; fills `metrics` with reshard timing/bytes and per-phase memory.
        `num_kv_blocks`: this rollout's KV need, which the hybrid scheme allocates per rollout; the resident one
        keeps the cache of its first wake, the engine config's (sized for the largest call). `beside_training`: the
        actor trains on another thread meanwhile (the early update), so the sleep leaves it cuBLAS's workspaces."""
        if getattr(self.engine, "shares_actor_weights", False):
            # the `hf` backend generates with the actor's own module: nothing to reshard, offload or sleep
            metrics["timing_s/reshard"] = 0.0
            with track_phase("gen", metrics, self.device):
                yield self.engine
            return
        t0 = time.perf_counter()
        with track_phase("reshard", metrics, self.device):
            if self.hybrid:
                self._enter_hybrid(metrics, num_kv_blocks)
            else:
                self._enter_resident(metrics)
        _sync(self.device)
        metrics["timing_s/switch_to_rollout"] = time.perf_counter() - t0
        try:
            with track_phase("gen", metrics, self.device):
                yield self.engine
        finally:
            t0 = time.perf_counter()
            if self.hybrid:
                lap = _Laps(self.device, metrics, "timing_s/switch_to_train/")
                self.engine.sleep(clear_workspaces=not beside_training)
                lap("sleep")
                _empty_cache(self.device)
                lap("release_engine_cache")
                if self.param_offload:
                    from hybridrl.training.offload import load_fsdp_params

                    load_fsdp_params(self.module, self.device)
            _sync(self.device)
            metrics["timing_s/switch_to_train"] = time.perf_counter() - t0

    def _enter_hybrid(self, metrics: dict, num_kv_blocks: int | None):
        lap = _Laps(self.device, metrics, "timing_s/switch_to_rollout/")
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self.optimizer_offload and self.optimizer is not None and not self._optimizer_on_cpu:
            from hybridrl.training.offload import offload_optimizer

            offload_optimizer(self.optimizer)
            self._optimizer_on_cpu = True
            lap("offload_optimizer")
        _empty_cache(self.device)
        lap("release_training_cache")
        self.engine.wake_up(tags=("weights",), borrowed=self.resharder.borrowed_names())
        lap("wake_weights")
        metrics.update(self.resharder.reshard().metrics())
        lap("reshard")
        if self.param_offload:
            from hybridrl.training.offload import offload_fsdp_params

            offload_fsdp_params(self.module)
            lap("offload_params")
        _empty_cache(self.device)
        self.engine.wake_up(tags=("kv_cache",), num_kv_blocks=num_kv_blocks)
        lap("wake_kv")

    def _enter_resident(self, metrics: dict):
        if not self._resident_ready:
            self.engine.wake_up(tags=("weights",))
            self.engine.wake_up(tags=("kv_cache",))
            self._resident_ready = True
        if self._weights_stale:
            metrics.update(self.resharder.reshard().metrics())
            self._weights_stale = False
        else:
            metrics["timing_s/reshard"] = 0.0

    def before_update(self, metrics: dict | None = None):
        """Bring the optimizer state back to the GPU (if it was offloaded) for the actor's optimizer step: the
        update calls it at its first step (FSDPUpdater.before_optimizer_step), after the backward, so the forward and
        backward run without the state. Timed as `timing_s/switch_to_train/load_optimizer` (part of the update's
        own time); a no-op once the state is back."""
        if self._optimizer_on_cpu:
            from hybridrl.training.offload import load_optimizer

            lap = _Laps(self.device, {} if metrics is None else metrics, "timing_s/switch_to_train/")
            load_optimizer(self.optimizer, self.device)
            lap("load_optimizer")
            self._optimizer_on_cpu = False

    def after_update(self):
        """Weights changed: scheme A must re-sync its resident copy at the next rollout; hybrid re-streams anyway."""
        self._weights_stale = True
