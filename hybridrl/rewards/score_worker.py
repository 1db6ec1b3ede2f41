"""A scorer running in a child process that is killed and replaced when one call overruns its deadline.

Why a process: a pure-Python scorer stuck in a loop (or a regex backtracking in C) cannot be interrupted by
a thread or a signal handler reliably — only killing the process that runs it can. Why `spawn`: the driver
holds CUDA contexts and Ray threads, which `fork` would copy in a broken state. The worker says "ready" once
it has unpickled the scoring function, and the deadline covers only the call itself, so the child's start-up
(imports) never counts as a timeout. Kept free of torch so the child starts in a fraction of a second.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import time
import weakref

__all__ = ["ScorerProcess", "check_picklable", "time_left"]

log = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 120.0
_deadline: float | None = None   # of the call this worker process is running


def time_left() -> float | None:
    """Seconds left before the call running in this scorer process is killed (reward_model.timeout_s), or None
    outside a worker process: a scorer that can cut its own work short (verl_compat.prime_code) reads it."""
    return None if _deadline is None else _deadline - time.monotonic()


def check_picklable(fn) -> None:
    try:
        pickle.dumps(fn)
    except Exception as e:
        raise ValueError(f"reward_model.timeout_s: the scoring function {fn!r} cannot be pickled ({e!r}), so it cannot "
                         "run in the timeout worker process; define it at module level or load it through "
                         "custom_reward_function.path, or set reward_model.timeout_s=null to score in-process "
                         "without a time limit") from e


def _worker_main(conn, fn_bytes: bytes) -> None:
    global _deadline
    try:
        fn = pickle.loads(fn_bytes)
    except BaseException as e:  # report instead of dying silently
        conn.send(("error", f"loading the scoring function failed: {e!r}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the driver has gone (closed, killed, or its pipe reset): leave quietly
            return
        if msg is None:
            return
        args, kwargs, timeout_s = msg
        _deadline = time.monotonic() + timeout_s
        try:
            _answer(conn, fn, args, kwargs)
        except OSError:
            return
        finally:
            _deadline = None


def _answer(conn, fn, args, kwargs) -> None:
    """One call's reply. OSError from the pipe propagates (the driver has gone); a result that does not pickle
    is reported as an error instead."""
    try:
        reply = ("ok", fn(*args, **kwargs))
    except BaseException as e:
        reply = ("error", repr(e))
    try:
        conn.send(reply)
    except OSError:
        raise
    except Exception as e:  # the result did not pickle
        conn.send(("error", f"the scorer's result could not be sent back: {e!r}"))


def _stop(proc, conn) -> None:
    try:
        conn.send(None)
    except Exception:
        pass
    proc.join(timeout=1.0)
    if proc.is_alive():
        proc.kill()
        proc.join()


class ScorerProcess:
    """`call(args, kwargs, timeout_s) -> (status, value)` with status 'ok' | 'error' | 'timeout'."""

    def __init__(self, fn):
        check_picklable(fn)
        self._fn_bytes = pickle.dumps(fn)
        self._ctx = mp.get_context("spawn")
        self._proc = self._conn = None
        self.restarts = 0
        self._finalizer = None

    def _start(self) -> tuple[str, str | None]:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child, self._fn_bytes), daemon=True,
                                 name="hybridrl-reward-scorer")
        proc.start()
        child.close()
        if not parent.poll(STARTUP_TIMEOUT_S):
            proc.kill()
            proc.join()
            return "error", f"scorer worker did not start within {STARTUP_TIMEOUT_S}s"
        try:
            status, value = parent.recv()
        except EOFError:
            status, value = "error", f"scorer worker died at start-up (exit code {proc.exitcode})"
        if status != "ready":
            proc.join()
            return "error", value
        self._proc, self._conn = proc, parent
        self._finalizer = weakref.finalize(self, _stop, proc, parent)
        return "ready", None

    def _kill(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        self._proc = self._conn = None
        self.restarts += 1

    def call(self, args: tuple, kwargs: dict | None, timeout_s: float) -> tuple[str, object]:
        if self._proc is None or not self._proc.is_alive():
            status, err = self._start()
            if status != "ready":
                return "error", err
        try:
            self._conn.send((args, kwargs or {}, timeout_s))
            if not self._conn.poll(timeout_s):
                self._kill()
                return "timeout", None
            return self._conn.recv()
        except (EOFError, BrokenPipeError, OSError) as e:
            exitcode = self._proc.exitcode if self._proc is not None else None
            self._kill()
            return "error", f"scorer worker died ({e!r}, exit code {exitcode})"
        except Exception as e:  # the result could not be unpickled
            return "error", f"reading the scorer's result failed: {e!r}"

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._proc = self._conn = None
