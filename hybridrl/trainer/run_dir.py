"""Claiming a run's directories before any worker starts: the run-directory lock, the removal of temporary
directories left by saves that never finished, then a write probe of every directory the run will write to
(checkpoints, logs).

Without the probe a read-only checkpoint root is found at the first save, after the steps before it are lost;
`os.access` is not enough (it says yes to root on a read-only bind mount or an immutable directory), so each
directory gets a real file created, written and deleted.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hybridrl.config.errors import RunStopError
from hybridrl.trainer.checkpoint_manager import remove_stale_temp
from hybridrl.trainer.run_lock import RunDirLockedError, RunLock

__all__ = ["RunDirNotWritableError", "check_writable", "run_log_dirs", "claim_run_dir"]


class RunDirNotWritableError(PermissionError, RunStopError):
    """A directory the run must write to cannot be written."""


def check_writable(dirs: dict[str, str | os.PathLike]) -> None:
    """Create each directory and write a probe file into it. `dirs` maps the setting that chose a directory to
    it; every failing one is named in a single RunDirNotWritableError."""
    problems = []
    for what, d in dirs.items():
        d = Path(d)
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".hybridrl-write-probe-", dir=d)
            try:
                os.write(fd, b"probe")
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as e:
            problems.append(f"{what}: {str(d)!r} is not writable ({type(e).__name__}: {e.strerror or e})")
    if problems:
        raise RunDirNotWritableError("the run could not save its checkpoints or logs; checked before step 1:\n  - "
                                     + "\n  - ".join(problems))


def run_log_dirs(loggers: list[str], log_dir: str | os.PathLike) -> dict[str, Path]:
    """The directories the configured logger backends write to (tracking.py's rules), keyed by what chose them."""
    dirs: dict[str, Path] = {"log directory ({default_local_dir}/logs)": Path(log_dir)}
    if "file" in loggers and os.environ.get("VERL_FILE_LOGGER_PATH"):
        dirs["$VERL_FILE_LOGGER_PATH's directory"] = Path(os.environ["VERL_FILE_LOGGER_PATH"]).parent
    if "tensorboard" in loggers and os.environ.get("TENSORBOARD_DIR"):
        dirs["$TENSORBOARD_DIR"] = Path(os.environ["TENSORBOARD_DIR"])
    return dirs


def claim_run_dir(run_dir: str | os.PathLike, log_dirs: dict[str, Path]) -> RunLock:
    """Lock `run_dir` (trainer.default_local_dir) for this run, remove the temporary directories of saves that
    never finished, then check it and `log_dirs` are writable. The caller releases the returned lock when the run
    ends; on any failure here nothing stays locked.

    The stale temp dirs go before the probe because a save that failed on a full disk leaves the disk full: the
    probe would refuse the restart although removing them frees the space (the complete checkpoints are kept)."""
    run_dir = Path(run_dir)
    what = "trainer.default_local_dir (checkpoint root)"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock(run_dir).acquire(record=False)
    except RunDirLockedError:
        raise
    except OSError:
        check_writable({what: run_dir})  # names why the lock file could not be made
        raise
    try:
        remove_stale_temp(run_dir)
        lock.record()
        check_writable({what: run_dir, **log_dirs})
    except BaseException:
        lock.release()
        raise
    return lock
