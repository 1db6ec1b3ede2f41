"""The actor-rollout worker's part of the early update (plan: `actor.early_update`; the driver's side is
trainer/early_update.py): the rollout runs on a background thread (workers/rollout_stream.py) and hands out its
finished prompt groups, while the worker's own thread accumulates the update's gradients over the groups the driver
has scored; one optimizer step follows the last group (training/actor.py, the streamed update).

The finished groups are handed out only once the rollout has reached its tail (fewer than TAIL_FRACTION of its
samples still running): before that, a decode step keeps the GPU busy and an update beside it slows the rollout by
as much as it hides.

Order of calls, every one on every rank: begin_early_update (the update's rows, its gradients zeroed) →
start_rollout_stream (the prompts) → take_rollout_stream / accumulate_actor, repeated until a take says the rollout
has ended → finish_early_update (the gradient put on the whole batch's normaliser, clipped, applied).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np

from hybridrl.controller import Dispatch, make_mesh_dispatch, register
from hybridrl.hybrid.memory import track_phase
from hybridrl.protocol import DataProto
from hybridrl.rollout.engine import TAIL_FRACTION
from hybridrl.workers.common import metric_lists, prompt_token_lists, sampling_params_from
from hybridrl.workers.rollout_stream import RolloutStream


class EarlyUpdateWorker:
    """Mixed into ActorRolloutRefWorker: uses its plan, actor, hybrid engine and `_generate`."""

    _rollout_stream: RolloutStream | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def begin_early_update(self, rows: int) -> None:
        """A streamed update of `rows` rows in all (the step's samples, over every data-parallel rank)."""
        if not self.plan.actor.early_update:
            raise RuntimeError("begin_early_update: the run plan has actor.early_update off")
        self.actor.begin_streamed_update(rows, self.config.actor_rollout_ref.rollout.response_length)

    @register(dispatch_mode=make_mesh_dispatch("rollout"))
    def start_rollout_stream(self, prompts: DataProto) -> None:
        """Start generating `prompts` on a background thread; finished groups wait for take_rollout_stream."""
        if self._rollout_stream is not None:
            raise RuntimeError("start_rollout_stream: the previous early update was not finished")
        rcfg = self.config.actor_rollout_ref.rollout
        params = sampling_params_from(rcfg, prompts.meta_info, dp_rank=self.rollout_coords.dp_rank)
        token_lists = prompt_token_lists(prompts)
        kv_blocks = self.plan.rollout.kv_cache.blocks_for(len(prompts), params.n)
        self._stream_prompts = prompts
        engine = self.engine
        self._rollout_stream = RolloutStream(
            lambda on_group_done: self._generate(token_lists, params, kv_blocks, beside_training=True,
                                                 on_group_done=on_group_done),
            self.compute_device,
            # before the tail a decode step keeps the GPU busy: an update beside it only slows it as much as it
            # hides (benchmarks/results/long_tail); in the tail the few running sequences leave the GPU idle
            in_tail=lambda: engine.unfinished_seqs < TAIL_FRACTION * engine.call_seqs)
        self._rollout_stream.start()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def take_rollout_stream(self, min_samples: int) -> DataProto | None:
        """The groups finished since the last take (waiting until `min_samples` samples are, or the rollout ends),
        as generate_sequences returns rows; meta_info["done"] once the rollout has ended, with its metrics and
        `seconds_since_end`. None on ranks that do not collect the rollout's output (TP ranks other than 0)."""
        from hybridrl.rollout.to_dataproto import outputs_to_dataproto

        stream = self._rollout_stream
        if stream is None:
            raise RuntimeError("take_rollout_stream: no rollout stream started")
        outputs, done = stream.take(min_samples)
        meta = {"done": done}
        if done and not stream.end_reported:   # once: a rank whose rollout ended first is asked again
            stream.end_reported = True
            meta["metrics"] = metric_lists(stream.metrics)
        if done:
            meta["seconds_since_end"] = time.perf_counter() - stream.ended_at
        if not self.rollout_coords.is_collect:
            return None
        if not outputs:
            return DataProto(meta_info=meta)
        prompts = self._stream_prompts.select_idxs(np.array([o.request_id for o in outputs]))
        out = outputs_to_dataproto(prompts, outputs, response_length=self.config.actor_rollout_ref.rollout.response_length,
                                   pad_token_id=int(prompts.meta_info.get("pad_token_id", 0)))
        out.meta_info.update(meta)
        return out

    @register(dispatch_mode=make_mesh_dispatch("actor"))
    def accumulate_actor(self, data: DataProto) -> DataProto:
        """The update's forward and backward over scored rows; returns their own old log-probs (no old-log-prob
        pass) and meta_info["during_rollout"]: whether the rollout was still running when this part began. Memory
        is tracked as its own phase only once the rollout has ended (before, the rollout's phase covers both)."""
        metrics: dict = {}
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        stream = self._rollout_stream
        during = stream is not None and not stream.ended
        with nullcontext() if during else track_phase("update_actor", metrics, self.compute_device):
            own = self.actor.accumulate(data)
        return DataProto({} if own is None else {"old_log_probs": own},
                         meta_info={"metrics": metric_lists(metrics), "during_rollout": during})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def finish_early_update(self) -> DataProto:
        """The streamed update's optimizer step; its metrics."""
        metrics: dict = {}
        stream, self._rollout_stream = self._rollout_stream, None
        if stream is not None and not stream.ended:
            raise RuntimeError("finish_early_update: the rollout is still running")
        with track_phase("update_actor", metrics, self.compute_device):
            self.hybrid.before_update(metrics)
            metrics.update(self.actor.finish_streamed_update())
        self.hybrid.after_update()
        return DataProto(meta_info={"metrics": metric_lists(metrics)})
