"""Ways to damage a run's files and directories, as disks, copies and users do (shared by the fault tests and
fault_table.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # the tests' tiny model (_training_tiny)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the typed sections it is trained with (typed_sections)


def overwrite_bytes(path: Path, offset: int = 64, data: bytes = b"\xde\xad\xbe\xef") -> None:
    """Flip a few bytes in place: same size, different content (the silent kind of corruption)."""
    with open(path, "r+b") as f:
        f.seek(min(offset, max(0, path.stat().st_size - len(data))))
        f.write(data)


def truncate(path: Path, keep: float = 0.5) -> None:
    with open(path, "r+b") as f:
        f.truncate(int(path.stat().st_size * keep))


def garbage(path: Path) -> None:
    """Replace the file by random bytes of the same size (a file from another run, or a bad copy)."""
    path.write_bytes(os.urandom(path.stat().st_size))


def largest_file(root: Path, under: str) -> Path:
    files = [p for p in (root / under).rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def _writable(d: Path) -> bool:
    try:
        (d / ".probe").write_bytes(b"")
        (d / ".probe").unlink()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _refuse_writes_under(d: Path):
    """Simulated read-only filesystem: os.open for writing and os.mkdir under `d` fail with EROFS."""
    real_open, real_mkdir, root = os.open, os.mkdir, str(d.resolve())

    def inside(p) -> bool:
        return os.path.abspath(os.fspath(p)).startswith(root)

    def ro_open(p, flags, *a, **k):
        if inside(p) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(p))
        return real_open(p, flags, *a, **k)

    def ro_mkdir(p, *a, **k):
        if inside(p):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(p))
        return real_mkdir(p, *a, **k)

    os.open, os.mkdir = ro_open, ro_mkdir
    try:
        yield
    finally:
        os.open, os.mkdir = real_open, real_mkdir


@contextlib.contextmanager
def read_only_dir(d: Path):
    """Make existing directory `d` unwritable; yields how. chmod 0555 binds ordinary users; root ignores it, so
    then `chattr +i` (needs CAP_LINUX_IMMUTABLE); where neither binds, writes under `d` are refused in-process."""
    mode = d.stat().st_mode
    d.chmod(0o555)
    immutable = False
    try:
        if not _writable(d):
            yield "chmod 0555"
            return
        chattr = shutil.which("chattr")
        if chattr and subprocess.run([chattr, "+i", str(d)], capture_output=True).returncode == 0:
            immutable = True
            if not _writable(d):
                yield "chattr +i"
                return
        with _refuse_writes_under(d):
            yield "simulated EROFS"
    finally:
        if immutable:
            subprocess.run([shutil.which("chattr"), "-i", str(d)], capture_output=True)
        d.chmod(mode)


def tiny_trained_actor(lr: float, seed: int = 0):
    """(model, optimizer, scheduler) of the tests' tiny Qwen2 after one AdamW step on a cosine schedule: a
    non-trivial optimizer state and scheduler position to save and load."""
    import torch
    import transformers
    from _training_tiny import tiny_qwen2_config
    from typed_sections import optim_section

    from hybridrl.training.optim import build_lr_scheduler, build_optimizer

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_qwen2_config(), dtype=torch.float32)
    optim_cfg = optim_section(lr=lr, warmup_style="cosine", min_lr_ratio=0.1)
    optimizer = build_optimizer(model.parameters(), optim_cfg)
    scheduler = build_lr_scheduler(optimizer, optim_cfg, total_training_steps=10)
    model(torch.randint(0, 300, (2, 8))).logits.float().pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


class LocalActorGroup:
    """Stands in for the actor's Ray worker group: the same save/load calls, on a local tiny model."""

    def __init__(self, lr: float, seed: int = 0):
        self.model, self.optimizer, self.scheduler = tiny_trained_actor(lr, seed)
        self.loaded_from: list[str] = []

    def save_checkpoint(self, path: str):
        from hybridrl.training.checkpoint import save_checkpoint

        save_checkpoint(path, self.model, self.optimizer, self.scheduler)

    def load_checkpoint(self, path: str):
        from hybridrl.training.checkpoint import load_checkpoint

        load_checkpoint(path, self.model, self.optimizer, self.scheduler)
        self.loaded_from.append(path)


class FakeLoader:
    """The dataloader's checkpoint interface (position only) without a dataset."""

    def __init__(self):
        self.state = {"epoch": 0, "batch_index": 0}

    def __len__(self):
        return 10

    def __iter__(self):  # placeholder batches, for a fit() whose train_step is stubbed
        return iter([None] * len(self))

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def make_trainer(run_dir: Path, *overrides: str, lr: float = 1e-3, seed: int = 0):
    """A RayPPOTrainer whose checkpoint calls go to a LocalActorGroup: the driver's save/resume path, no Ray."""
    from hybridrl.config.loader import load_config
    from hybridrl.trainer.checkpoint_manager import CheckpointManager
    from hybridrl.trainer.ppo_trainer import RayPPOTrainer

    config = load_config(overrides=[f"trainer.default_local_dir={run_dir}", "actor_rollout_ref.rollout.n=2",
                                    f"actor_rollout_ref.actor.optim.lr={lr}", "trainer.total_training_steps=10",
                                    *overrides])
    actor = LocalActorGroup(lr, seed)
    return RayPPOTrainer(config, None, actor, None, None, None, FakeLoader(), None, None,
                         CheckpointManager(run_dir, fsync=False), n_gpus=1)


def trained_run(run_dir: Path, steps=(1, 2), lr: float = 1e-3):
    """A run directory with a checkpoint at each of `steps`, one optimizer step apart (their weights differ)."""
    import torch

    trainer = make_trainer(run_dir, lr=lr)
    for step in steps:
        actor = trainer.actor_rollout_wg
        actor.model(torch.randint(0, 300, (2, 8))).logits.float().pow(2).mean().backward()
        actor.optimizer.step()
        actor.optimizer.zero_grad()
        actor.scheduler.step()
        trainer.global_steps = step
        trainer.save_checkpoint()
    return trainer


def crash_holding_lock(run_dir: Path) -> int:
    """Start a process that takes the run-directory lock and dies without releasing it; returns its pid."""
    repo = Path(__file__).resolve().parents[2]
    code = (f"import os, sys; sys.path.insert(0, {str(repo)!r}); from hybridrl.trainer.run_lock import RunLock; "
            f"RunLock({str(run_dir)!r}).acquire(); print(os.getpid()); os._exit(3)")  # _exit skips all cleanup
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert dead.returncode == 3, dead.stderr
    return int(dead.stdout)


@contextlib.contextmanager
def small_disk(path: Path, size_kb: int):
    """A tmpfs of `size_kb` KiB mounted at `path` for the block (as root; pytest.skip-able SkipCase otherwise)."""
    if os.geteuid() != 0:
        raise SkipCase("needs root to mount a small tmpfs (a full disk cannot be made otherwise)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SkipCase(f"mounting a tmpfs failed: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


class SkipCase(Exception):
    """A fault case this machine cannot stage; the reason says why."""
