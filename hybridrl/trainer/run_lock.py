"""One run per run directory: an exclusive lock on `{run_dir}/hybridrl.lock`, held for the whole run.

Two runs on one directory would write checkpoints alternately, interleave `metrics.jsonl`, and each run's startup
cleanup would delete the other's in-flight temporary checkpoint. The lock is `fcntl.flock` on the lock file, so the
kernel releases it when the holding process dies, however it dies: a crashed run never blocks the next one. The
file also holds the holder's pid, host and start time, for the refusal message and for the takeover warning after
a crash (the lock is free but the file still names the dead holder). A clean release empties the file.

Filesystems without flock support (some network mounts) fall back to the recorded pid: a live pid on this host, or
any holder on another host (whose liveness cannot be checked from here), refuses; a dead pid on this host is taken
over with a warning.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from hybridrl.config.errors import RunStopError

__all__ = ["RunLock", "RunDirLockedError", "LOCK_FILE"]

logger = logging.getLogger("hybridrl.run_lock")

LOCK_FILE = "hybridrl.lock"


class RunDirLockedError(RuntimeError, RunStopError):
    """Another live run holds the run directory."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class RunLock:
    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self.previous_holder: dict | None = None  # a crashed run whose stale lock this one took over

    def _read_holder(self) -> dict:
        text = os.pread(self._fd, 4096, 0).decode("utf-8", "replace")
        try:
            return json.loads(text) if text.strip() else {}
        except ValueError:  # not ours or half-written: still a holder, reported as found
            return {"raw": text[:200]}

    def _refuse(self, holder: dict) -> RunDirLockedError:
        who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        since = holder.get("started")
        when = f", running since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else ""
        return RunDirLockedError(
            f"run directory {self.run_dir} is in use by another run ({who}{when}; lock file {self.path}). Two runs on "
            "one directory overwrite each other's checkpoints and logs: wait for it to end, stop it, or set "
            "trainer.default_local_dir to another directory")

    def acquire(self, record: bool = True) -> RunLock:
        """Take the lock, or raise RunDirLockedError naming the holder. record=False leaves writing this process's
        name to `record()`: on a full disk the lock is taken first, space freed, then the name written."""
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._lock_or_refuse()
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        if record:
            self.record()
        return self

    def record(self) -> None:
        """Write this process's pid, host and start time into the held lock file (what a refused run is told)."""
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(me).encode(), 0)
        os.fsync(self._fd)

    def _lock_or_refuse(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            flock_works = True
        except BlockingIOError:
            holder = self._read_holder()
            if not holder:  # it took the lock an instant ago and is writing its name: read once more
                time.sleep(0.2)
                holder = self._read_holder()
            raise self._refuse(holder) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            flock_works = False
        holder = self._read_holder()
        if not holder:
            return
        same_host = holder.get("host") == socket.gethostname()
        pid = holder.get("pid")
        if not flock_works and (not same_host or (isinstance(pid, int) and _pid_alive(pid))):
            raise self._refuse(holder)
        self.previous_holder = holder
        logger.warning("run directory %s: taking over the lock of pid %s on host %s, which no longer holds it (that "
                       "run ended without releasing it, e.g. it crashed or was killed)", self.run_dir, pid,
                       holder.get("host"))

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # a clean exit leaves no holder to report
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
