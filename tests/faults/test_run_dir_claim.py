"""The run-directory lock (one run per directory, released on exit, taken over after a crash) and the write
check of the checkpoint and log directories before step 1."""

import json
import logging
import os
import socket

import pytest
from fault_inject import crash_holding_lock, read_only_dir

from hybridrl.trainer.run_dir import RunDirNotWritableError, check_writable, claim_run_dir, run_log_dirs
from hybridrl.trainer.run_lock import LOCK_FILE, RunDirLockedError, RunLock


def test_second_run_on_the_same_directory_is_refused_naming_the_holder(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirLockedError) as err:
            RunLock(tmp_path).acquire()
    msg = str(err.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in msg and str(tmp_path) in msg
    assert "trainer.default_local_dir" in msg


def test_lock_is_released_on_exit_and_leaves_no_holder(tmp_path):
    lock = RunLock(tmp_path).acquire()
    lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""
    again = RunLock(tmp_path).acquire()
    assert again.held and again.previous_holder is None
    again.release()


def test_lock_of_a_crashed_run_is_taken_over_with_a_warning(tmp_path, caplog):
    dead_pid = crash_holding_lock(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == dead_pid  # the crash left its name behind
    with caplog.at_level(logging.WARNING, logger="hybridrl.run_lock"):
        lock = RunLock(tmp_path).acquire()
    assert lock.previous_holder["pid"] == dead_pid
    assert any(f"pid {dead_pid}" in r.getMessage() and "taking over" in r.getMessage() for r in caplog.records)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_read_only_checkpoint_root_is_named_before_step_1(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    with read_only_dir(root), pytest.raises(RunDirNotWritableError) as err:
        claim_run_dir(root, run_log_dirs(["console"], root / "logs"))
    assert f"trainer.default_local_dir (checkpoint root): {str(root)!r} is not writable" in str(err.value)


def test_read_only_log_directory_is_named_and_the_lock_released(tmp_path, monkeypatch):
    logs = tmp_path / "tb"
    logs.mkdir()
    monkeypatch.setenv("TENSORBOARD_DIR", str(logs))
    with read_only_dir(logs), pytest.raises(RunDirNotWritableError, match=r"\$TENSORBOARD_DIR: .*tb' is not writable"):
        claim_run_dir(tmp_path / "run", run_log_dirs(["console", "tensorboard"], tmp_path / "run" / "logs"))
    RunLock(tmp_path / "run").acquire().release()  # the failed claim did not keep the directory locked


def test_check_writable_lists_every_failing_directory(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(RunDirNotWritableError) as err:
        check_writable({"first": blocker / "x", "fine": tmp_path / "ok", "second": blocker / "y"})
    msg = str(err.value)
    assert "first:" in msg and "second:" in msg and "fine:" not in msg
    assert not list((tmp_path / "ok").iterdir())  # the probe file is removed


def test_run_ppo_claims_the_directory_first_and_releases_it_on_any_exit(tmp_path):
    from hybridrl.config.loader import load_config
    from hybridrl.trainer.launch import run_ppo

    cfg = load_config(overrides=[f"trainer.default_local_dir={tmp_path}", "actor_rollout_ref.rollout.n=2",
                                 f"actor_rollout_ref.model.path={tmp_path / 'no_model'}"])
    with RunLock(tmp_path), pytest.raises(RunDirLockedError):
        run_ppo(cfg)  # refused before it even looks at the (missing) model
    with pytest.raises(FileNotFoundError, match="no_model"):
        run_ppo(cfg)  # the directory is free: the run gets as far as its first bad input
    RunLock(tmp_path).acquire().release()  # and that failed run let go of the directory
