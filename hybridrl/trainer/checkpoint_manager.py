"""Atomic, resumable checkpoint directories with verl's layout.

Layout under `root` (= trainer.default_local_dir):
    global_step_N/                      one complete checkpoint (actor/, critic/, data.pt ... as written)
    global_step_N/COMPLETE              marker, written last (JSON: step, file count, bytes, per-file checksums)
    latest_checkpointed_iteration.txt   "N" — the last committed step (verl reads the same file)

Guarantee: a directory named `global_step_N` is always complete. Contents are written into
`root/.tmp-global_step_N-<random>/`; commit fsyncs every file, writes COMPLETE (fsynced), renames the
temp directory to `global_step_N` (one atomic rename on POSIX, same filesystem by construction),
fsyncs `root`, and then replaces the tracker file atomically (temp file + fsync + os.replace). A crash
before the marker leaves only a `.tmp-*` directory, removed when the next manager starts; a crash after the
marker but before the rename leaves a sealed `.tmp-*` directory, which the next manager restores as
`global_step_N` (and the tracker to it) instead of removing; a crash between rename and tracker update leaves the
tracker on the previous (complete) step. Loading checks the marker, so a directory copied in by hand or by another
tool without it (verl's own checkpoints) is refused, not trusted: `auto` resume stops with an error naming it when it
is newer than every complete checkpoint (starting over beside it would hide it), and a save never deletes it (a
step that would replace it moves it aside as `global_step_N.unverified-<time>`).

Integrity: the marker records every file's size and blake2b checksum (checkpoint_integrity.py); resuming
re-hashes them first. A corrupt, truncated or missing file is reported by name; `auto` resume then falls back
to the newest checkpoint that verifies (logged, counted in `num_corrupt_skipped`), `resume_path` refuses.

Multi-rank use (one process commits, everybody writes):
    driver / rank 0:  tmp = mgr.begin(step)          # path on a filesystem all writers see
    every writer:     write its shards under tmp     # e.g. Ray workers: worker.save_checkpoint(tmp / "actor")
    driver / rank 0:  mgr.commit(step)               # only after every writer returned; mgr.abort(step) on error
With torch.distributed, `save_distributed(mgr, step, write_fn, group)` does exactly this: rank 0 begins,
broadcasts the path, every rank calls write_fn(tmp, rank), failures are gathered, rank 0 commits or
aborts, and every rank gets the final path (or the same RuntimeError). Construct the manager with
`clean_stale=False` on ranks other than 0, and never point two concurrent runs at one root: startup
cleanup deletes any `.tmp-*` directory it finds.

Retention (`max_to_keep`, None = keep all): after a commit, the new checkpoint plus the
max_to_keep - 1 highest other steps are kept; the rest of the complete `global_step_*` directories are
deleted (counted in `num_deleted`). Directories without the marker are never deleted.
Resume modes (trainer.resume_mode): `auto` = the tracker's step if that checkpoint is complete, else
the highest complete step, else None; `disable` = None; `resume_path` = trainer.resume_from_path,
which must be an existing, complete, verifying `global_step_N` directory. A run holds `run_lock.RunLock` on
the root, so no second run's startup cleanup can delete this run's temporary directories.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from hybridrl.config.errors import RunStopError
from hybridrl.trainer.checkpoint_integrity import (
    CHECKSUM_ALGORITHM,
    CheckpointCorruptError,
    file_checksums,
    verify_checkpoint,
)

__all__ = ["CheckpointManager", "CheckpointSaveError", "remove_stale_temp", "save_distributed", "step_of",
           "is_complete", "TRACKER_FILE", "COMPLETE_MARKER", "CheckpointCorruptError"]

logger = logging.getLogger("hybridrl.checkpoint")

TRACKER_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_MARKER = "COMPLETE"
RESUME_MODES = ("auto", "disable", "resume_path")
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_TMP_PREFIX = ".tmp-"
_SEALED_TMP = re.compile(r"^\.tmp-(?:old-)?global_step_(\d+)-[0-9a-f]+$")   # begin()'s and commit()'s temp names


def step_of(path: str | os.PathLike) -> int:
    """N from a `.../global_step_N` path; ValueError if the last component is not of that form."""
    m = _STEP_DIR.match(Path(path).name)
    if not m:
        raise ValueError(f"checkpoint path {str(path)!r} must end in a 'global_step_<N>' directory")
    return int(m.group(1))


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms / filesystems that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> tuple[int, int]:
    """fsync every file and directory under root; returns (number of files, total bytes)."""
    n_files = n_bytes = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            n_files += 1
            n_bytes += path.stat().st_size
        _fsync_dir(Path(dirpath))
    return n_files, n_bytes


def _write_durable(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


class CheckpointSaveError(OSError, RunStopError):
    """A save that did not complete; its temporary directory is gone and earlier checkpoints are untouched."""


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def _is_disk_full(e: BaseException | None) -> bool:
    """ENOSPC (or EDQUOT) anywhere in the exception's chain; a worker's error arrives as text (Ray)."""
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def restore_sealed(root: Path) -> list[int]:
    """Rename the sealed (marked, verifying) `.tmp-*` checkpoint directories an interrupted commit left to their
    `global_step_N` where none exists, a step's new directory before an old one moved aside for it, and move the
    tracker up to the newest restored step; returns the restored steps."""
    restored = []
    sealed = sorted((p for p in root.iterdir() if _SEALED_TMP.match(p.name) and p.is_dir() and is_complete(p)),
                    key=lambda p: p.name.startswith(f"{_TMP_PREFIX}old-"))
    for p in sealed:
        final = root / f"global_step_{_SEALED_TMP.match(p.name).group(1)}"
        if not final.exists() and not verify_checkpoint(p, COMPLETE_MARKER):
            os.rename(p, final)
            restored.append(step_of(final))
            logger.warning("restored %s from %s, sealed by a save that stopped before renaming it", final, p.name)
    if restored:
        _fsync_dir(root)
        tracked = _read_tracker(root)
        if tracked is None or max(restored) > tracked:
            _write_tracker(root, max(restored))
    return restored


def _read_tracker(root: Path) -> int | None:
    """The tracker's step; None without one or when it holds no step number (logged)."""
    path = root / TRACKER_FILE
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8").strip()
    if not text.isdigit():
        logger.warning("%s holds %r, not a step number; ignoring it", path, text)
        return None
    return int(text)


def _write_tracker(root: Path, step: int) -> None:
    """The tracker file replaced atomically (temp file, fsync, os.replace, fsync of the directory)."""
    tmp = root / f"{_TMP_PREFIX}tracker-{secrets.token_hex(4)}"
    _write_durable(tmp, str(step))
    os.replace(tmp, root / TRACKER_FILE)
    _fsync_dir(root)


def remove_stale_temp(root: str | os.PathLike) -> tuple[int, int]:
    """Restore sealed checkpoints an interrupted commit left (restore_sealed), then remove the other `.tmp-*`
    leftovers of interrupted saves under `root` (only while holding its run lock: they may be a live run's
    otherwise); returns (entries, bytes) removed, logged when any."""
    removed = freed = 0
    root = Path(root)
    if root.is_dir():
        restore_sealed(root)
    for p in root.iterdir() if root.is_dir() else ():
        if p.name.startswith(_TMP_PREFIX):
            freed += _tree_bytes(p) if p.is_dir() else p.stat().st_size
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            removed += 1
    if removed:
        logger.warning("removed %d stale temporary checkpoint entries (%d bytes) in %s", removed, freed, root)
    return removed, freed


class CheckpointManager:
    def __init__(self, root_dir: str | os.PathLike, max_to_keep: int | None = None, clean_stale: bool = True,
                 fsync: bool = True):
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int)
                                        or max_to_keep < 1):
            raise ValueError(f"max_to_keep (trainer.max_actor_ckpt_to_keep) must be None (keep all) or an int >= 1, "
                             f"got {max_to_keep!r}")
        self.root = Path(root_dir)
        self.max_to_keep = max_to_keep
        self.fsync = fsync
        self.num_deleted = 0
        self.num_stale_removed = 0
        self.num_corrupt_skipped = 0
        self._pending: dict[int, Path] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        if clean_stale:
            self.num_stale_removed = self.clean_stale()

    # ------------------------------------------------------------------ paths
    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{int(step)}"

    def complete_steps(self) -> list[int]:
        """Steps of the complete `global_step_N` directories, ascending."""
        steps = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir() and is_complete(p):
                steps.append(int(m.group(1)))
        return sorted(steps)

    def unmarked_steps(self) -> list[int]:
        """Steps of the `global_step_N` directories without the marker (not written by this manager), ascending."""
        return sorted(int(m.group(1)) for p in self.root.iterdir()
                      if (m := _STEP_DIR.match(p.name)) and p.is_dir() and not is_complete(p))

    def clean_stale(self) -> int:
        """Restore the sealed `.tmp-*` checkpoints an interrupted commit left, remove the other `.tmp-*` leftovers
        of interrupted saves; returns how many were removed."""
        return remove_stale_temp(self.root)[0]

    # ------------------------------------------------------------------ saving
    def begin(self, step: int) -> Path:
        """Create and return the temporary directory that step's contents go into."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")
        if step in self._pending:
            raise ValueError(f"checkpoint for step {step} already begun at {self._pending[step]}; commit or abort it")
        tmp = self.root / f"{_TMP_PREFIX}global_step_{step}-{secrets.token_hex(4)}"
        tmp.mkdir()
        self._pending[step] = tmp
        return tmp

    def abort(self, step: int, cause: BaseException | None = None) -> CheckpointSaveError | None:
        """Remove the step's temporary directory. With the exception that stopped the save, returns the error to
        raise in its place: it names the step, the directory, the cause (for a full disk: the bytes written
        before it filled, the free and total space, the size of the last complete checkpoint) and what is kept."""
        tmp = self._pending.pop(step, None)
        written = _tree_bytes(tmp) if tmp is not None else 0
        at_failure = shutil.disk_usage(self.root)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if cause is None or isinstance(cause, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            return None  # an interrupt stays itself (torch's CheckpointException is a BaseException, not one)
        kept = self.complete_steps()
        keeps = (f"the last complete checkpoint, {self.step_dir(kept[-1]).name} ({_tree_bytes(self.step_dir(kept[-1]))}"
                 " bytes), is intact" if kept else "no earlier complete checkpoint exists")
        # writers do not all say ENOSPC (torch's zip writer reports a short write as "unexpected pos"), so a
        # filesystem left all but full by the failed save counts too
        if _is_disk_full(cause) or at_failure.free < min(1 << 20, at_failure.total // 100):
            why = (f"no space left on the device: {written} bytes were written before it filled, "
                   f"{at_failure.free} of {at_failure.total} bytes were free then, "
                   f"{shutil.disk_usage(self.root).free} bytes are free now; cause: {_first_line(cause)}")
        else:
            why = _first_line(cause)
        return CheckpointSaveError(
            f"saving the checkpoint of step {step} under {self.root} failed ({why}); its temporary directory was "
            f"removed and {keeps}. Free space or point trainer.default_local_dir elsewhere, then resume")

    def commit(self, step: int) -> Path:
        """Seal the begun temp directory as `global_step_N`, update the tracker, apply retention."""
        tmp = self._pending.get(step)
        if tmp is None:
            raise ValueError(f"commit({step}): no checkpoint begun for that step (call begin({step}) first)")
        if not tmp.is_dir():
            self._pending.pop(step)
            raise FileNotFoundError(f"commit({step}): temporary checkpoint directory {tmp} vanished before commit")
        n_files, n_bytes = _fsync_tree(tmp) if self.fsync else (sum(1 for p in tmp.rglob("*") if p.is_file()), 0)
        marker = json.dumps({"step": step, "files": n_files, "bytes": n_bytes, "time": time.time(),
                             "algorithm": CHECKSUM_ALGORITHM, "checksums": file_checksums(tmp)})
        _write_durable(tmp / COMPLETE_MARKER, marker)
        final = self.step_dir(step)
        old = None
        if final.exists() and not is_complete(final):   # not ours (no marker): kept under another name
            kept = self.root / f"{final.name}.unverified-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
            os.rename(final, kept)
            logger.warning("%s has no %s marker (not written by hybridrl): moved to %s, not deleted", final,
                           COMPLETE_MARKER, kept.name)
        if final.exists():  # re-saving a step (e.g. after resuming from it): swap, never expose a partial dir
            old = self.root / f"{_TMP_PREFIX}old-global_step_{step}-{secrets.token_hex(4)}"
            os.rename(final, old)
        os.rename(tmp, final)
        self._pending.pop(step)
        _fsync_dir(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _write_tracker(self.root, step)
        self._apply_retention(keep_step=step)
        return final

    def save(self, step: int, write_fn: Callable[[Path], None]) -> Path:
        """write_fn(tmp_dir) writes the contents; on any exception nothing named global_step_N appears, the temp
        dir is removed, and an error (not an interrupt) comes back as CheckpointSaveError naming the cause."""
        tmp = self.begin(step)
        try:
            write_fn(tmp)
            return self.commit(step)
        except BaseException as e:
            error = self.abort(step, e)
            if error is None:
                raise
            raise error from e

    def _apply_retention(self, keep_step: int) -> None:
        if self.max_to_keep is None:
            return
        others = [s for s in reversed(self.complete_steps()) if s != keep_step]
        for s in others[self.max_to_keep - 1:]:
            shutil.rmtree(self.step_dir(s))
            self.num_deleted += 1
            logger.info("retention (max_to_keep=%d): deleted %s", self.max_to_keep, self.step_dir(s))

    # ------------------------------------------------------------------ loading
    def read_tracker(self) -> int | None:
        return _read_tracker(self.root)

    def verify(self, path: str | os.PathLike) -> list[str]:
        """Problems with a complete checkpoint's files against its marker's checksums ([] = verified)."""
        problems = verify_checkpoint(path, COMPLETE_MARKER)
        if problems is None:
            logger.warning("%s has no checksums in its %s marker (written before they were recorded): loading it "
                           "unverified", path, COMPLETE_MARKER)
            return []
        return problems

    def find_latest(self) -> Path | None:
        """The newest complete checkpoint that verifies: the tracker's step first, then the others from the highest
        down; None if there is none. Each one skipped as corrupt is logged with its files and counted; if every
        complete checkpoint is corrupt, CheckpointCorruptError names them all (starting fresh would hide it)."""
        tracked = self.read_tracker()
        steps = self.complete_steps()
        foreign = [u for u in self.unmarked_steps() if not steps or u > steps[-1]]
        if foreign:
            names = ", ".join(self.step_dir(u).name for u in foreign)
            raise CheckpointCorruptError(
                f"{self.root} holds {names} without the {COMPLETE_MARKER} marker, newer than "
                + (f"its last complete checkpoint, {self.step_dir(steps[-1]).name}" if steps else
                   "any complete checkpoint") + ": written by another tool (verl's checkpoints have their own "
                "format) or copied in unfinished, so hybridrl cannot resume from it, and resuming from an older "
                "step or starting over beside it would hide it. Move it away, point trainer.default_local_dir "
                "elsewhere, or set trainer.resume_mode=disable (a save never deletes such a directory: it is moved "
                "aside as global_step_N.unverified-<time>)")
        if tracked is not None and tracked not in steps:
            logger.warning("tracker points to step %d but %s is missing or incomplete; using %s", tracked,
                           self.step_dir(tracked), f"step {steps[-1]}" if steps else "no checkpoint")
        order = ([tracked] if tracked in steps else []) + [s for s in reversed(steps) if s != tracked]
        corrupt = []
        for step in order:
            path = self.step_dir(step)
            problems = self.verify(path)
            if not problems:
                if corrupt:
                    logger.warning("auto resume: falling back to %s, the newest checkpoint that verifies (%d newer "
                                   "corrupt one(s) skipped: %s)", path, len(corrupt), ", ".join(corrupt))
                return path
            self.num_corrupt_skipped += 1
            corrupt.append(path.name)
            logger.error("checkpoint %s is corrupt and will not be loaded:\n  %s", path, "\n  ".join(problems))
        if corrupt:
            raise CheckpointCorruptError(f"no checkpoint in {self.root} verifies (corrupt: {', '.join(corrupt)}; the "
                                         "files are named above); set trainer.resume_mode=disable to start fresh")
        return None

    def resolve_resume(self, resume_mode: str, resume_from_path: str | os.PathLike | None = None) -> Path | None:
        """The checkpoint directory to resume from, or None to start fresh (see module docstring)."""
        if resume_mode == "disable":
            return None
        if resume_mode == "auto":
            return self.find_latest()
        if resume_mode != "resume_path":
            raise ValueError(f"trainer.resume_mode={resume_mode!r} is not one of {list(RESUME_MODES)}")
        if not resume_from_path:
            raise ValueError("trainer.resume_mode='resume_path' needs trainer.resume_from_path, which is unset")
        path = Path(resume_from_path)
        if not path.is_dir():
            raise FileNotFoundError(f"trainer.resume_from_path={str(path)!r} does not exist or is not a directory")
        step_of(path)  # must name its step, as in verl
        if not is_complete(path):
            raise ValueError(f"trainer.resume_from_path={str(path)!r} has no {COMPLETE_MARKER} marker: the checkpoint "
                             "is incomplete (interrupted save) or was not written by hybridrl's CheckpointManager")
        problems = self.verify(path)
        if problems:
            raise CheckpointCorruptError(f"trainer.resume_from_path={str(path)!r} is corrupt:\n  " + "\n  ".join(problems))
        return path


def save_distributed(manager: CheckpointManager | None, step: int, write_fn: Callable[[Path, int], None],
                     group=None) -> Path:
    """Collective save over a torch.distributed group (all ranks call it). Rank 0 of the group owns
    `manager` (others may pass None); write_fn(tmp_dir, rank) writes that rank's part."""
    import torch.distributed as dist

    rank = dist.get_rank(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    box = [None]
    if rank == 0:
        try:
            if manager is None:
                raise ValueError("save_distributed: rank 0 must pass its CheckpointManager, got None")
            box[0] = {"tmp": str(manager.begin(step)), "error": None}
        except Exception as e:  # broadcast the failure so the other ranks do not wait forever
            box[0] = {"tmp": None, "error": f"rank 0 begin: {type(e).__name__}: {e}"}
    dist.broadcast_object_list(box, src=src, group=group)
    if box[0]["error"]:
        raise RuntimeError(f"checkpoint step {step} not saved; {box[0]['error']}")
    tmp = Path(box[0]["tmp"])
    error = None
    try:
        write_fn(tmp, rank)
    except Exception as e:  # gathered below so every rank fails together instead of hanging
        error = f"rank {rank}: {type(e).__name__}: {e}"
    errors = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    failed = [e for e in errors if e is not None]
    outcome = [None]
    if rank == 0:
        try:
            outcome[0] = {"error": None, "path": None}
            if failed:
                manager.abort(step)
            else:
                outcome[0]["path"] = str(manager.commit(step))
        except Exception as e:  # tell the other ranks before raising, or they wait forever
            outcome[0] = {"error": f"rank 0 commit: {type(e).__name__}: {e}", "path": None}
    dist.broadcast_object_list(outcome, src=src, group=group)
    if outcome[0]["error"]:
        failed.append(outcome[0]["error"])
    if failed:
        raise RuntimeError(f"checkpoint step {step} not saved; failures: {failed}")
    return Path(outcome[0]["path"])
