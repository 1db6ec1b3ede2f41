"""CheckpointManager: atomic commit, crash safety, stale cleanup, retention, resume modes, multi-rank save."""

import json
import os
import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import end_process_group

from hybridrl.trainer.checkpoint_manager import (
    COMPLETE_MARKER,
    TRACKER_FILE,
    CheckpointCorruptError,
    CheckpointManager,
    save_distributed,
    step_of,
)


def write_model(text):
    def fn(tmp):
        (tmp / "actor").mkdir()
        (tmp / "actor" / "model.pt").write_text(text)
    return fn


def entries(root):
    return sorted(p.name for p in root.iterdir())


def test_save_commits_atomically_named_dir_with_marker_and_tracker(tmp_path):
    mgr = CheckpointManager(tmp_path)
    seen = []
    path = mgr.save(3, lambda tmp: seen.append(tmp) or write_model("w3")(tmp))
    assert seen[0].parent == tmp_path and seen[0].name.startswith(".tmp-global_step_3-")  # written elsewhere
    assert path == tmp_path / "global_step_3" and step_of(path) == 3
    assert (path / "actor" / "model.pt").read_text() == "w3" and (path / COMPLETE_MARKER).is_file()
    assert (tmp_path / TRACKER_FILE).read_text() == "3"
    assert entries(tmp_path) == ["global_step_3", TRACKER_FILE]  # no temp leftovers
    assert mgr.find_latest() == path


def test_crash_inside_write_fn_leaves_previous_latest_intact(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, write_model("w1"))

    def crash(tmp):
        write_model("half")(tmp)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        mgr.save(2, crash)
    assert entries(tmp_path) == ["global_step_1", TRACKER_FILE]
    assert (tmp_path / TRACKER_FILE).read_text() == "1"
    assert (mgr.find_latest() / "actor" / "model.pt").read_text() == "w1"


def test_killed_process_leftovers_are_cleaned_at_startup(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, write_model("w1"))
    tmp = mgr.begin(2)  # the process "dies" here: nothing commits
    write_model("half")(tmp)
    (tmp_path / ".tmp-tracker-dead").write_text("2")
    assert mgr.find_latest() == tmp_path / "global_step_1"
    restarted = CheckpointManager(tmp_path)
    assert restarted.num_stale_removed == 2
    assert entries(tmp_path) == ["global_step_1", TRACKER_FILE]
    assert CheckpointManager(tmp_path, clean_stale=False).num_stale_removed == 0


def test_retention_keeps_newest_and_the_one_just_saved(tmp_path):
    mgr = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3, 4):
        mgr.save(step, write_model(f"w{step}"))
    assert entries(tmp_path) == ["global_step_3", "global_step_4", TRACKER_FILE]
    assert mgr.num_deleted == 2
    (tmp_path / "global_step_0").mkdir()  # not ours (no marker): reported by nobody, deleted by nobody
    mgr.save(2, write_model("again"))  # e.g. resumed from an older step: the new save must survive
    assert entries(tmp_path) == ["global_step_0", "global_step_2", "global_step_4", TRACKER_FILE]
    assert mgr.find_latest() == tmp_path / "global_step_2"  # last saved, as the tracker says
    with pytest.raises(ValueError, match="max_to_keep"):
        CheckpointManager(tmp_path, max_to_keep=0)


def test_resaving_a_step_replaces_it(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(5, write_model("old"))
    mgr.save(5, write_model("new"))
    assert (tmp_path / "global_step_5" / "actor" / "model.pt").read_text() == "new"
    assert entries(tmp_path) == ["global_step_5", TRACKER_FILE]


def test_find_latest_falls_back_when_tracker_is_stale_or_garbage(tmp_path):
    mgr = CheckpointManager(tmp_path)
    assert mgr.find_latest() is None
    mgr.save(1, write_model("w1"))
    mgr.save(2, write_model("w2"))
    (tmp_path / TRACKER_FILE).write_text("9")  # points to a checkpoint that does not exist
    assert mgr.find_latest() == tmp_path / "global_step_2"
    (tmp_path / TRACKER_FILE).write_text("garbage")
    assert mgr.find_latest() == tmp_path / "global_step_2"
    (tmp_path / "global_step_1b").mkdir()  # not a step directory: ignored
    assert mgr.find_latest() == tmp_path / "global_step_2"


def test_unmarked_checkpoints_are_never_resumed_past_nor_deleted(tmp_path):
    """A global_step_N without the marker (verl's own checkpoints, a copy): auto resume stops naming it when it is
    newer than every complete one, and a save of that step moves it aside instead of deleting it."""
    mgr = CheckpointManager(tmp_path)
    mgr.save(2, write_model("w2"))
    foreign = tmp_path / "global_step_4"
    (foreign / "actor").mkdir(parents=True)
    (foreign / "actor" / "model_world_size_1_rank_0.pt").write_text("verl's")
    with pytest.raises(CheckpointCorruptError, match=r"global_step_4 without the COMPLETE marker, newer than its "
                                                     r"last complete checkpoint, global_step_2.*resume_mode=disable"):
        mgr.find_latest()
    assert mgr.resolve_resume("disable") is None
    mgr.save(4, write_model("w4"))   # a fresh run reaching step 4 keeps the foreign directory
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("global_step_4.unverified-")]
    assert len(kept) == 1 and (kept[0] / "actor" / "model_world_size_1_rank_0.pt").read_text() == "verl's"
    assert mgr.find_latest() == tmp_path / "global_step_4"   # no unmarked step directory is newer now
    (tmp_path / "global_step_1").mkdir()   # older than the complete ones: not in the way of resuming
    assert mgr.find_latest() == tmp_path / "global_step_4"
    assert mgr.unmarked_steps() == [1]


def test_a_sealed_checkpoint_left_by_an_interrupted_commit_is_restored(tmp_path):
    """A crash after the marker but before the rename (or between moving the old step aside and renaming the new)
    leaves complete `.tmp-*` directories: the next manager restores them instead of deleting them."""
    mgr = CheckpointManager(tmp_path)
    mgr.save(3, write_model("w3"))
    tmp = mgr.begin(5)
    write_model("w5")(tmp)
    mgr.commit(5)
    os.rename(tmp_path / "global_step_5", tmp)          # as if it stopped before its rename
    (tmp_path / TRACKER_FILE).write_text("3")
    old = tmp_path / ".tmp-old-global_step_3-00aa"       # and a step moved aside for a re-save that never landed
    os.rename(tmp_path / "global_step_3", old)
    unsealed = tmp_path / ".tmp-global_step_6-00bb"      # interrupted before its marker: removed
    unsealed.mkdir()
    restarted = CheckpointManager(tmp_path)
    assert restarted.complete_steps() == [3, 5] and restarted.num_stale_removed == 1 and not unsealed.exists()
    assert (tmp_path / "global_step_5" / "actor" / "model.pt").read_text() == "w5"
    assert restarted.read_tracker() == 5 and restarted.find_latest() == tmp_path / "global_step_5"


def test_resume_modes(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt")
    assert mgr.resolve_resume("auto") is None  # nothing saved yet: start fresh
    p = mgr.save(4, write_model("w4"))
    assert mgr.resolve_resume("auto") == p
    assert mgr.resolve_resume("disable") is None
    assert mgr.resolve_resume("resume_path", str(p)) == p
    with pytest.raises(ValueError, match="resume_from_path"):
        mgr.resolve_resume("resume_path", None)
    missing = tmp_path / "nowhere" / "global_step_1"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        mgr.resolve_resume("resume_path", missing)
    with pytest.raises(ValueError, match="global_step_<N>"):
        mgr.resolve_resume("resume_path", tmp_path)
    partial = tmp_path / "global_step_9"
    partial.mkdir()
    with pytest.raises(ValueError, match="COMPLETE"):
        mgr.resolve_resume("resume_path", partial)
    with pytest.raises(ValueError, match="'sometimes'.*auto"):
        mgr.resolve_resume("sometimes")


def test_begin_commit_for_several_writers(tmp_path):
    mgr = CheckpointManager(tmp_path)
    tmp = mgr.begin(6)
    for rank in range(2):  # e.g. two Ray workers writing their shards into the shared temp dir
        (tmp / "actor").mkdir(exist_ok=True)
        (tmp / "actor" / f"model_world_size_2_rank_{rank}.pt").write_text(str(rank))
    assert not (tmp_path / "global_step_6").exists()
    final = mgr.commit(6)
    assert sorted(p.name for p in (final / "actor").iterdir()) == [
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    with pytest.raises(ValueError, match="begin\\(7\\)"):
        mgr.commit(7)
    with pytest.raises(ValueError, match=">= 0"):
        mgr.begin(-1)


# ------------------------------------------------------------------ two gloo ranks
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dist_worker(rank, world, port, root):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mgr = CheckpointManager(root, clean_stale=rank == 0) if rank == 0 else None

        def write(tmp, r):
            (tmp / f"shard_{r}.pt").write_text(str(r))

        path = save_distributed(mgr, 1, write)
        ok_files = sorted(p.name for p in path.iterdir())

        def fail_on_rank1(tmp, r):
            if r == 1:
                raise OSError("rank 1 disk full")
            write(tmp, r)

        try:
            save_distributed(mgr, 2, fail_on_rank1)
            err = None
        except RuntimeError as e:
            err = str(e)
        with open(os.path.join(os.path.dirname(root), f"result_{rank}.json"), "w") as f:
            json.dump([str(path), ok_files, err], f)
    finally:
        end_process_group()


@pytest.mark.slow
def test_save_distributed_two_gloo_ranks(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    mp.spawn(_dist_worker, args=(2, _free_port(), str(root)), nprocs=2, join=True)
    for rank in range(2):
        path, files, err = json.loads((tmp_path / f"result_{rank}.json").read_text())
        assert path == str(root / "global_step_1")
        assert files == [COMPLETE_MARKER, "shard_0.pt", "shard_1.pt"]
        assert "rank 1 disk full" in err  # both ranks learn of the failure
    assert entries(root) == ["global_step_1", TRACKER_FILE]
