"""MemoryTimeline: recording rules, metrics intake, JSON round trip, PNG plots."""

import json
import logging

import pytest

from hybridrl.trainer.memory_timeline import MemoryTimeline, plot_comparison

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def two_step_timeline(name="hybrid", scale=1.0):
    tl = MemoryTimeline(name)
    for step in (1, 2):
        tl.record(step, "update_actor", 30.0 * scale, 31.0 * scale)
        tl.record(step, "gen", 32.0 * scale + step, 40.0 * scale)
        tl.record(step, "my_phase", 1.0)
        tl.record(step, "old_log_prob", 20.0 * scale)
    return tl


def test_record_orders_phases_and_keeps_the_larger_peak():
    tl = two_step_timeline()
    assert tl.phases() == ["gen", "old_log_prob", "update_actor", "my_phase"]  # step order, unknown last
    tl.record(1, "gen", 5.0)  # smaller than the 33.0 already there: a peak stays a peak
    assert [v for s, p, v in tl.series() if (s, p) == (1, "gen")] == [33.0]
    assert tl.peak_gb() == 34.0 and tl.peak_gb("reserved") == 40.0
    assert tl.phase_peaks()["gen"] == 34.0
    assert [(s, p) for s, p, _ in tl.series("reserved")] == [(1, "gen"), (1, "update_actor"),
                                                             (2, "gen"), (2, "update_actor")]
    with pytest.raises(ValueError, match="'gen' peak_allocated_gb"):
        tl.record(3, "gen", -1.0)
    with pytest.raises(ValueError, match="kind"):
        tl.series("free")


def test_record_from_metrics_takes_only_memory_keys():
    tl = MemoryTimeline()
    metrics = {"memory/gen/peak_allocated_gb": 2.5, "memory/gen/peak_reserved_gb": 3.0,
               "memory/update_actor/peak_allocated_gb": 1.5, "perf/max_memory_allocated_gb": 9.0,
               "timing_s/gen": 1.0}
    assert tl.record_metrics(7, metrics) == 3
    assert tl.data == {7: {"gen": {"allocated": 2.5, "reserved": 3.0}, "update_actor": {"allocated": 1.5}}}


def test_json_round_trip(tmp_path):
    tl = two_step_timeline()
    path = tl.to_json(tmp_path / "out" / "mem.json")
    raw = json.loads(path.read_text())
    assert raw["name"] == "hybrid" and raw["peak_allocated_gb"] == 34.0 and raw["steps"]["2"]["gen"]["allocated"] == 34.0
    back = MemoryTimeline.from_json(path)
    assert back.data == tl.data and back.name == "hybrid"
    with pytest.raises(FileNotFoundError, match="nope.json"):
        MemoryTimeline.from_json(tmp_path / "nope.json")


def test_plots_write_png(tmp_path, caplog):
    tl = two_step_timeline()
    out = tl.plot(tmp_path / "mem.png", title="hybrid, 2 steps")
    assert out.read_bytes()[:8] == PNG_MAGIC
    cmp = plot_comparison(two_step_timeline("scheme A", scale=1.6), tl, tmp_path / "cmp.png")
    assert cmp.read_bytes()[:8] == PNG_MAGIC and cmp.stat().st_size > out.stat().st_size
    with caplog.at_level(logging.WARNING, logger="hybridrl.memory"):
        empty = MemoryTimeline("empty").plot(tmp_path / "x.png")  # a run whose workers reported nothing
    assert empty.read_bytes()[:8] == PNG_MAGIC and "no records" in caplog.text
    with pytest.raises(ValueError, match="no records"):
        plot_comparison(MemoryTimeline("empty"), tl, tmp_path / "y.png")


