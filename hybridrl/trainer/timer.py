"""Wall-clock timers for the fit loop, shaped like verl's `marked_timer` / `_timer`.

`marked_timer(name, timing_raw)` adds the elapsed seconds of its block to `timing_raw[name]`.
Choices:
- it *accumulates* (verl's `_timer` overwrites): a phase that runs twice in one step (e.g. two
  generation passes, or old_log_prob in micro-batches timed separately) then reports its total, and
  a caller who wants one measurement simply starts the step with a fresh dict;
- the time is recorded even when the block raises, so a failing step still shows where time went;
- `time.perf_counter` (monotonic, high resolution); no CUDA synchronisation here: the worker calls
  that the driver times are blocking already (Ray `get`), so the driver's clock is the step's clock.
The `color` argument of verl's signature is accepted and ignored (it colours NVTX/profiler ranges
there), so verl call sites port unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["marked_timer", "simple_timer"]


@contextmanager
def marked_timer(name: str, timing_raw: dict[str, float], color: str | None = None, **_unused) -> Iterator[None]:
    """Add the seconds spent inside the block to `timing_raw[name]` (created at 0.0 when absent)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"marked_timer: name must be a non-empty string, got {name!r}")
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + (time.perf_counter() - start)


simple_timer = marked_timer  # verl's other spelling of the same thing
