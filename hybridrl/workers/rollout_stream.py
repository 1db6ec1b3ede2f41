"""A rollout that hands out its finished prompt groups while the rest still decode (the early update's source).

`RolloutStream(run, device)` runs `run(on_group_done)` — the worker's generate call between the hybrid engine's
wake-up and sleep — on a background thread; every group the engine reports finished is queued, and `take` returns
the queued groups once enough samples are waiting (and, with `in_tail`, the rollout has reached its tail), or once
it has ended. Meanwhile the worker's own thread trains on groups taken earlier (training/actor.py, the streamed
update).

Why a thread and a second CUDA stream: the decode tail runs a few sequences per step, latency-bound, leaving most of
the GPU idle, and the update's forward/backward can fill it only if its kernels can run beside the decode steps. On
a GPU the rollout runs on its own high-priority stream (the training thread keeps the default stream), so the
device interleaves the two and a decode step's kernels go first when both wait. Python's thread switch interval is
shortened while the stream runs, so the decode loop's host work is not held up for whole 5 ms slices by the
training thread's kernel launches.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import torch

SWITCH_INTERVAL_S = 0.0005   # Python's default is 0.005: a decode step's host work would wait that long
TAIL_POLL_S = 0.02


class RolloutStream:
    """`run(on_group_done)` -> (outputs, metrics), run on a background thread from `start()`. `in_tail()`, if given,
    says whether the rollout has reached its tail: `take` hands out nothing before (the groups wait)."""

    def __init__(self, run: Callable, device: torch.device, in_tail: Callable[[], bool] | None = None):
        self._run, self.device, self._in_tail = run, device, in_tail
        self._ready: list = []          # RequestOutputs finished and not taken yet
        self._cond = threading.Condition()
        self._done = False
        self._error: BaseException | None = None
        self.outputs: list | None = None     # every output, once the rollout has ended
        self.metrics: dict = {}
        self.samples_taken = 0
        self.end_reported = False            # a take has said the rollout ended (with its metrics)
        self.ended_at: float | None = None   # perf_counter when the rollout ended
        self._thread = threading.Thread(target=self._main, name="rollout-stream", daemon=True)
        self._switch: float | None = sys.getswitchinterval()   # restored once the rollout has ended

    @property
    def ended(self) -> bool:
        return self._done

    def start(self) -> None:
        sys.setswitchinterval(min(self._switch, SWITCH_INTERVAL_S))
        self._thread.start()

    def _on_group_done(self, output) -> None:
        with self._cond:
            self._ready.append(output)
            self._cond.notify_all()

    def _main(self) -> None:
        try:
            with torch.no_grad():
                if self.device.type == "cuda":
                    torch.cuda.set_device(self.device)   # the current device is per thread
                    with torch.cuda.stream(torch.cuda.Stream(self.device, priority=-1)):
                        outputs, metrics = self._run(self._on_group_done)
                else:
                    outputs, metrics = self._run(self._on_group_done)
            with self._cond:
                self.outputs, self.metrics = outputs, metrics
        except BaseException as e:  # handed to the thread that takes: a failed rollout must not pass silently
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._done = True
                self.ended_at = time.perf_counter()
                self._cond.notify_all()

    def take(self, min_samples: int, timeout_s: float | None = None) -> tuple[list, bool]:
        """(the finished groups not taken yet, whether the rollout has ended), once at least `min_samples` samples
        are waiting (and the rollout is in its tail, with `in_tail`) or it has ended. Raises the rollout's own
        exception if it failed, TimeoutError after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def enough() -> bool:
            return (sum(len(o.outputs) for o in self._ready) >= min_samples
                    and (self._in_tail is None or self._in_tail()))
        with self._cond:
            while not self._done and not enough():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the rollout stream had no {min_samples} finished samples within "
                                       f"{timeout_s} s")
                # the tail begins without a group finishing: look again every TAIL_POLL_S
                self._cond.wait(left if self._in_tail is None else min(left or TAIL_POLL_S, TAIL_POLL_S))
            ready, self._ready = self._ready, []
            done, error = self._done, self._error
        if done and self._switch is not None:   # once, by the first take that sees the end
            self._thread.join()
            sys.setswitchinterval(self._switch)
            self._switch = None
        if error is not None:
            raise RuntimeError("the streamed rollout failed") from error
        self.samples_taken += sum(len(o.outputs) for o in ready)
        return ready, done
