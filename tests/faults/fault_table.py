"""Replays the faults a user meets (run directory and checkpoints; rewards; bad inputs) and prints what the user
gets, one row each.

    python tests/faults/fault_table.py        # prints the table; exit status 1 if any case misbehaves

Each case damages a run the way a disk, a copy or a second user would (or feeds it what a bad scorer, data file
or setting gives), goes through the real code path (the driver's save/resume in RayPPOTrainer, the checkpoint
files of the tests' tiny Qwen2, the run-directory claim and input checks of launch.py, the reward manager and
the trainer's reward-error guard, config validation), checks the behaviour and returns the outcome. No Ray: a local stand-in replaces the worker group, so
the whole table runs in seconds (tests/faults/test_fault_table.py runs it in CI).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fault_inject import (  # noqa: E402
    SkipCase,
    crash_holding_lock,
    garbage,
    largest_file,
    make_trainer,
    overwrite_bytes,
    read_only_dir,
    small_disk,
    trained_run,
    truncate,
)

from hybridrl.trainer.checkpoint_manager import CheckpointSaveError  # noqa: E402
from hybridrl.trainer.resume_check import ResumeConfigError  # noqa: E402
from hybridrl.trainer.run_dir import RunDirNotWritableError, check_writable, claim_run_dir  # noqa: E402
from hybridrl.trainer.run_lock import RunDirLockedError, RunLock  # noqa: E402


@contextlib.contextmanager
def captured_logs(*names: str):
    """The messages logged (WARNING and up) on the named loggers while the block runs, kept from the console."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    loggers = [logging.getLogger(n) for n in names]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.WARNING)
        lg.propagate = False
    try:
        yield messages
    finally:
        for lg, (level, propagate) in zip(loggers, saved):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate


def _resume_over_damaged_newest(tmp: Path, damage: Callable[[Path], None]) -> str:
    run = tmp / "run"
    trained_run(run)
    shard = largest_file(run / "global_step_2", "actor/model")
    damage(shard)
    trainer = make_trainer(run)
    with captured_logs("hybridrl.checkpoint") as logs:
        step = trainer.load_checkpoint()
    assert step == 1, f"resumed at step {step}, not at the verified step 1"
    assert trainer.actor_rollout_wg.loaded_from == [str(run / "global_step_1" / "actor")]
    assert trainer.ckpt.num_corrupt_skipped == 1
    named = [m for m in logs if str(shard) in m]
    assert named, f"no log message names {shard}: {logs}"
    assert any("falling back to" in m for m in logs), logs
    problem = named[0].split(str(shard) + ": ")[1].split("\n")[0]
    return f"names {shard.relative_to(run)} ({problem}); auto resume falls back to global_step_1 (logged, counted)"


def case_corrupt_shard(tmp: Path) -> str:
    return _resume_over_damaged_newest(tmp, overwrite_bytes)


def case_truncated_shard(tmp: Path) -> str:
    return _resume_over_damaged_newest(tmp, truncate)


def case_garbage_shard(tmp: Path) -> str:
    return _resume_over_damaged_newest(tmp, garbage)


def case_second_run_same_dir(tmp: Path) -> str:
    with RunLock(tmp / "run"):
        try:
            claim_run_dir(tmp / "run", {})
        except RunDirLockedError as e:
            msg = str(e)
        else:
            raise AssertionError("the second run was allowed to start")
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in msg, msg
    return "refused before any worker starts: " + msg.split(" (", 1)[1].split(";")[0].replace(str(tmp), "…")


def case_lock_left_by_crashed_run(tmp: Path) -> str:
    dead = crash_holding_lock(tmp / "run")
    with captured_logs("hybridrl.run_lock") as logs:
        lock = claim_run_dir(tmp / "run", {})
    lock.release()
    assert lock.previous_holder["pid"] == dead and any(f"pid {dead}" in m for m in logs), logs
    return f"starts; warns that it takes over the lock of dead pid {dead} (the OS released the flock)"


def case_read_only_checkpoint_root(tmp: Path) -> str:
    root = tmp / "ckpt"
    root.mkdir()
    with read_only_dir(root) as how:
        try:
            claim_run_dir(root, {})
        except RunDirNotWritableError as e:
            msg = str(e)
        else:
            raise AssertionError("a read-only checkpoint root was accepted")
    assert str(root) in msg, msg
    return f"refused before step 1 ({how}): " + msg.split("\n  - ")[1].replace(str(tmp), "…")


def case_changed_lr_on_resume(tmp: Path) -> str:
    run = tmp / "run"
    before = trained_run(run, lr=1e-3).actor_rollout_wg
    trainer = make_trainer(run, lr=4e-3)
    with captured_logs("hybridrl.resume", "hybridrl.checkpoint") as logs:
        trainer.load_checkpoint()
    sched = trainer.actor_rollout_wg.scheduler
    group = trainer.actor_rollout_wg.optimizer.param_groups[0]
    want = 4e-3 * sched.lr_lambdas[0](sched.last_epoch)
    assert sched.last_epoch == before.scheduler.last_epoch and abs(group["lr"] - want) < 1e-12, (group["lr"], want)
    assert any("actor_rollout_ref.actor.optim.lr: 0.001 in the checkpoint, 0.004 now" in m for m in logs), logs
    old = before.optimizer.param_groups[0]["lr"]
    return f"takes effect: lr {group['lr']:.3g} at the resumed schedule step (saved: {old:.3g}); listed at start"


def case_changed_model_on_resume(tmp: Path) -> str:
    run = tmp / "run"
    trained_run(run, steps=(1,))
    trainer = make_trainer(run, f"actor_rollout_ref.model.path={tmp / 'another_model'}")
    try:
        trainer.load_checkpoint()
    except ResumeConfigError as e:
        msg = str(e)
    else:
        raise AssertionError("resumed with another model")
    assert "actor_rollout_ref.model.path" in msg and trainer.actor_rollout_wg.loaded_from == [], msg
    return "refused before any weights load, naming actor_rollout_ref.model.path with both values"


class _CharTokenizer:
    """What the reward manager needs of a tokenizer (decode), and a pad id for a dataset."""

    pad_token_id = eos_token_id = 0

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def _scored(truths: list, scores: list[float]) -> tuple[dict, int]:
    """The reward manager's output for one response per truth; the scorer returns `scores` in order and counts
    its calls (in-process: timeout_s=None)."""
    import torch

    from hybridrl.protocol import DataProto
    from hybridrl.rewards import RewardManager

    calls = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(ground_truth)
        return scores[len(calls) - 1]

    n = len(truths)
    batch = DataProto.from_dict({"responses": torch.ones(n, 4, dtype=torch.long),
                                 "response_mask": torch.ones(n, 4, dtype=torch.long)},
                                {"data_source": ["arith"] * n, "reward_model": [{"ground_truth": t} for t in truths]})
    with captured_logs("hybridrl.rewards.reward_manager"):
        out = RewardManager(_CharTokenizer(), compute_score=scorer, timeout_s=None)(batch)
    return out, len(calls)


def case_non_finite_reward(tmp: Path) -> str:
    from hybridrl.rewards.error_guard import RewardErrorLimitError

    out, _ = _scored(["1"] * 4, [float("inf"), float("-inf"), float("nan"), 1.0])
    rewards, m = out["reward_tensor"].sum(-1).tolist(), out["metrics"]
    assert rewards == [0.0, 0.0, 0.0, 1.0] and m["reward/errors"] == 3, (rewards, m)
    trainer = make_trainer(tmp / "run")
    trainer.reward_guard.check(1, m)  # 3 of 4 failed: below the default limit (all of a step), the run goes on
    all_bad, _ = _scored(["1"] * 4, [float("inf")] * 4)
    try:
        trainer.reward_guard.check(2, all_bad["metrics"])
    except RewardErrorLimitError as e:
        msg = str(e)
    else:
        raise AssertionError("a step whose every reward was inf did not stop the run")
    return ("inf/-inf/NaN scored 0 and counted (reward/errors=3 of 4); a step where all fail stops the run: "
            + msg.split(", which")[0])


def case_missing_ground_truth(tmp: Path) -> str:
    out, calls = _scored(["1", None, "2"], [1.0, 0.5, 1.0])
    m = out["metrics"]
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.5, 1.0] and calls == 3, (out["reward_tensor"], calls)
    assert m["reward/errors"] == 0 and m["reward/missing_ground_truths"] == 1, m
    return ("a custom scorer gets None, as in verl, and the sample is counted (reward/missing_ground_truths=1); the "
            "default scorer does not score it (0, counted as an error)")


def case_empty_val_file(tmp: Path) -> str:
    import pyarrow.parquet as pq

    from hybridrl.config.loader import load_config
    from hybridrl.data.tasks import make_dataset
    from hybridrl.trainer.launch import load_dataset

    make_dataset("arith", tmp, n_train=2, n_test=2, seed=0, digits=1, operands=2, ops="+")
    empty = tmp / "empty.parquet"
    pq.write_table(pq.read_table(tmp / "test.parquet").slice(0, 0), empty)
    try:
        load_dataset(str(empty), "data.val_files", _CharTokenizer(), load_config().data)
    except ValueError as e:
        msg = str(e)
    else:
        raise AssertionError("an empty validation file was accepted")
    assert str(empty) in msg and "data.val_files" in msg, msg
    return "refused before any worker starts: " + msg.replace(str(tmp), "…")


def case_negative_lr(tmp: Path) -> str:
    from hybridrl.config import ConfigError, load_config

    try:
        load_config(overrides=["actor_rollout_ref.actor.optim.lr=-1e-05"])
    except ConfigError as e:
        msg = str(e)
    else:
        raise AssertionError("a negative learning rate was accepted")
    assert "'actor_rollout_ref.actor.optim.lr' must be > 0, got -1e-05" in msg, msg
    return "refused at load (and by `hybridrl config check`): " + msg.split("\n  - ")[1]


def case_empty_model_dir(tmp: Path) -> str:
    from hybridrl.trainer.launch import check_model_dir

    (tmp / "model").mkdir()
    try:
        check_model_dir(tmp / "model", "actor_rollout_ref.model.path")
    except FileNotFoundError as e:
        msg = str(e)
    else:
        raise AssertionError("an empty model directory was accepted")
    return "refused before any worker starts: " + msg.replace(str(tmp), "…").split(";")[0]


def _full_disk_run(disk: Path) -> Path:
    """A run directory on `disk` with a checkpoint at step 1 and too little room for a second."""
    run = disk / "run"
    trained_run(run, steps=(1,))
    return run


def case_checkpoint_save_on_a_full_disk(tmp: Path) -> str:
    with small_disk(tmp / "disk", 3 * 1024) as disk:  # a checkpoint of the tiny model is about 1.6 MB
        run = _full_disk_run(disk)
        trainer = make_trainer(run)
        trainer.global_steps = 2
        try:
            trainer.save_checkpoint()
        except CheckpointSaveError as e:
            msg = str(e)
        else:
            raise AssertionError("a save on a full disk did not fail")
        leftovers = [p.name for p in run.iterdir() if p.name.startswith(".tmp-")]
        assert not leftovers, leftovers
        assert "no space left" in msg and "global_step_1" in msg and "bytes are free" in msg, msg
        assert make_trainer(run).load_checkpoint() == 1
    return "the save fails, its temp dir is removed, step 1 resumes: " + msg.split("(", 1)[1].split(";")[0]


def case_restart_after_a_save_filled_the_disk(tmp: Path) -> str:
    with small_disk(tmp / "disk", 3 * 1024) as disk:
        run = _full_disk_run(disk)
        stale = run / ".tmp-global_step_2-killed"  # what a save killed mid-write leaves: nothing aborted it
        stale.mkdir()
        with contextlib.suppress(OSError), open(stale / "shard", "wb") as f:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        try:
            check_writable({"run": run})
        except RunDirNotWritableError:
            pass
        else:
            raise AssertionError("the disk was not full")
        claim_run_dir(run, {}).release()
        assert not stale.exists()
        assert make_trainer(run).load_checkpoint() == 1
    return "the stale temp dir is removed before the write probe (which alone refused the full disk); step 1 resumes"


CASES = [case_corrupt_shard, case_truncated_shard, case_garbage_shard, case_second_run_same_dir,
         case_lock_left_by_crashed_run, case_read_only_checkpoint_root, case_changed_lr_on_resume,
         case_changed_model_on_resume, case_non_finite_reward, case_missing_ground_truth, case_empty_val_file,
         case_negative_lr, case_empty_model_dir, case_checkpoint_save_on_a_full_disk,
         case_restart_after_a_save_filled_the_disk]


def run_case(case: Callable[[Path], str]) -> tuple[str, str, bool]:
    """(case name, outcome, behaved as documented)."""
    name = case.__name__.removeprefix("case_").replace("_", " ")
    with tempfile.TemporaryDirectory(prefix="hybridrl-fault-") as tmp, contextlib.redirect_stdout(io.StringIO()), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # DCP in one process, as meant
        try:
            return name, case(Path(tmp)), True
        except SkipCase as e:
            return name, f"skipped: {e}", True
        except Exception as e:  # a misbehaving case is a row of the table, not the end of it
            return name, f"{type(e).__name__}: {e}".split("\n")[0], False


def format_table(rows: list[tuple[str, str, bool]]) -> str:
    width = max(len(r[0]) for r in rows)
    lines = [f"{'case':<{width}}  ok    outcome", f"{'-' * width}  ----  {'-' * 7}"]
    lines += [f"{name:<{width}}  {'yes' if ok else 'NO':<4}  {outcome}" for name, outcome, ok in rows]
    return "\n".join(lines)


def main() -> int:
    rows = [run_case(case) for case in CASES]
    print(format_table(rows))
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
