"""Checkpoint integrity: per-file checksums in the COMPLETE marker, verified before resuming; a corrupt newest
checkpoint is named and auto resume falls back to the newest one that verifies."""

import json
import logging

import pytest
from fault_inject import garbage, overwrite_bytes, truncate

from hybridrl.trainer.checkpoint_manager import COMPLETE_MARKER, CheckpointCorruptError, CheckpointManager

SHARD = "actor/model/__0_0.distcp"


def write_shard(payload: bytes):
    def fn(tmp):
        (tmp / "actor" / "model").mkdir(parents=True)
        (tmp / SHARD).write_bytes(payload)
        (tmp / "trainer_state.json").write_text(json.dumps({"global_step": 0}))
    return fn


@pytest.fixture
def two_steps(tmp_path):
    mgr = CheckpointManager(tmp_path, fsync=False)
    mgr.save(1, write_shard(b"weights of step one " * 50))
    mgr.save(2, write_shard(b"weights of step two " * 50))
    return mgr


def test_marker_records_size_and_checksum_of_every_file(two_steps):
    marker = json.loads((two_steps.step_dir(2) / COMPLETE_MARKER).read_text())
    assert set(marker["checksums"]) == {SHARD, "trainer_state.json"}
    assert marker["checksums"][SHARD][0] == 1000
    assert marker["algorithm"] == "blake2b" and len(marker["checksums"][SHARD][1]) == 64
    assert two_steps.verify(two_steps.step_dir(2)) == []


@pytest.mark.parametrize("damage, expect", [
    (overwrite_bytes, "checksum differs"),
    (truncate, "500 bytes, 1000 recorded"),
    (garbage, "checksum differs"),
    (lambda p: p.unlink(), "missing"),
], ids=["bytes-overwritten", "truncated", "garbage-same-size", "deleted"])
def test_auto_resume_falls_back_to_newest_verifying_checkpoint(two_steps, caplog, damage, expect):
    damage(two_steps.step_dir(2) / SHARD)
    with caplog.at_level(logging.WARNING, logger="hybridrl.checkpoint"):
        assert two_steps.resolve_resume("auto") == two_steps.step_dir(1)
    assert two_steps.num_corrupt_skipped == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(two_steps.step_dir(2) / SHARD) in errors[0] and expect in errors[0]
    assert any("falling back to" in r.getMessage() and "global_step_1" in r.getMessage() for r in caplog.records)


def test_resume_path_to_a_corrupt_checkpoint_names_the_file(two_steps):
    overwrite_bytes(two_steps.step_dir(2) / SHARD)
    with pytest.raises(CheckpointCorruptError, match=r"global_step_2/actor/model/__0_0\.distcp: blake2b checksum"):
        two_steps.resolve_resume("resume_path", two_steps.step_dir(2))


def test_every_checkpoint_corrupt_refuses_instead_of_starting_fresh(two_steps):
    for step in (1, 2):
        overwrite_bytes(two_steps.step_dir(step) / SHARD)
    with pytest.raises(CheckpointCorruptError, match=r"corrupt: global_step_2, global_step_1.*resume_mode=disable"):
        two_steps.find_latest()
    assert two_steps.num_corrupt_skipped == 2


def test_marker_without_checksums_loads_unverified_with_a_warning(two_steps, caplog):
    marker = two_steps.step_dir(2) / COMPLETE_MARKER
    marker.write_text(json.dumps({"step": 2, "files": 2, "bytes": 0}))  # as written before checksums existed
    with caplog.at_level(logging.WARNING, logger="hybridrl.checkpoint"):
        assert two_steps.find_latest() == two_steps.step_dir(2)
    assert any("no checksums" in r.getMessage() for r in caplog.records)
