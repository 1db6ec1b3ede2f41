"""Loggers: console line, jsonl file, tensorboard, wandb (faked module), generations, progress bar."""

import io
import json
import logging
import sys
import types

import numpy as np
import pytest
import torch

from hybridrl.trainer.tracking import (
    Tracking,
    ValidationGenerationsLogger,
    format_console_line,
    make_progress_bar,
    select_generations,
)

METRICS = {
    "critic/score/mean": 0.75,
    "actor/pg_loss": np.float32(-0.125),
    "response_length/mean": torch.tensor(3.5),
    "timing_s/step": 2.0,
    "perf/throughput": 12345.6,
    "actor/lr": 1e-6,  # not curated: file only
    "val-core/gsm8k/acc/mean@4": 0.5,
}


def test_console_prints_one_short_line_and_full_dict_at_debug(caplog):
    out = io.StringIO()
    with caplog.at_level(logging.DEBUG, logger="hybridrl.tracking"):
        t = Tracking("p", "e", ["console"], stream=out)
        t.log(METRICS, step=3)
        t.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step 3 | ")
    assert lines[0].endswith(" elapsed | score 0.75 | resp_len 3.5 | step_s 2 | val/gsm8k/acc/mean@4 0.5"), lines
    assert "actor/lr" in caplog.text and "actor/pg_loss" in caplog.text  # everything is there at DEBUG
    assert format_console_line({}, 0) == "step 0"


def test_console_line_counts_steps_with_elapsed_and_eta():
    """Steps take 10 s after a step-0 validation that took 30 s: the ETA is measured from training's start."""
    now = [100.0]
    out = io.StringIO()
    t = Tracking("p", "e", ["console"], stream=out, total_steps=60)
    t.logger["console"].clock = lambda: now[0]
    t.logger["console"].start = 100.0
    t.log({"training/dataset_rows": 600}, step=0)   # nothing curated: no line
    now[0] = 130.0
    t.log({"val-core/arith/acc/mean@1": 0.01}, step=0)
    for step in (1, 2):
        now[0] += 10.0
        t.log({"critic/score/mean": 0.5, "timing_s/step": 10.0}, step=step)
    lines = out.getvalue().splitlines()
    assert lines == ["step 0/60 | val/arith/acc/mean@1 0.01",
                     "step 1/60 | 40s elapsed, ETA 9:50 | score 0.5 | step_s 10",
                     "step 2/60 | 50s elapsed, ETA 9:40 | score 0.5 | step_s 10"]
    assert all(len(line) < 100 for line in lines)


def test_durations_read_as_clock_times():
    from hybridrl.trainer.tracking import format_duration

    assert [format_duration(s) for s in (0.4, 42, 187, 3723)] == ["0s", "42s", "3:07", "1:02:03"]


def test_file_backend_writes_valid_jsonl_flushed_each_step(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    t = Tracking("p", "e", "file", log_dir=tmp_path)
    t.log(METRICS, step=1)
    path = tmp_path / "metrics.jsonl"
    assert str(path) in capsys.readouterr().out  # the path is printed
    assert len(path.read_text().splitlines()) == 1  # flushed before finish
    t.log({"critic/score/mean": 1.0}, step=2)
    t.finish()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["data"]["actor/pg_loss"] == -0.125 and records[0]["data"]["response_length/mean"] == 3.5
    assert records[0]["data"]["actor/lr"] == 1e-6 and records[1]["data"] == {"critic/score/mean": 1.0}


def test_file_path_from_env_and_resumed_run_appends(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "m.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    for step in (1, 2):
        with Tracking("p", "e", ["file"], log_dir=tmp_path / "unused") as t:
            t.log({"x": step}, step=step)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_a_resumed_run_drops_what_the_killed_run_logged_after_its_checkpoint(tmp_path, monkeypatch):
    """Killed after logging steps 3-4 with the checkpoint at step 2: the resumed run logs 3 and 4 again, once each;
    a last line cut by a full disk or a kill is neither glued to the next record nor kept."""
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    with Tracking("p", "e", "file", log_dir=tmp_path) as t:
        for step in range(1, 5):
            t.log({"x": step}, step=step)
        t.log_generations([("q", "a", 1.0)], step=4, console=False)
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 5, "data": {"x": ')   # cut mid-record
    with Tracking("p", "e", "file", log_dir=tmp_path) as t:
        t.resumed(2)
        for step in (3, 4):
            t.log({"x": step * 10}, step=step)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["data"]["x"]) for r in records] == [(1, 1), (2, 2), (3, 30), (4, 40)]
    assert (tmp_path / "generations.jsonl").read_text() == ""   # step 4's validation samples are re-logged too


def test_a_cut_last_line_gets_a_line_break_before_the_next_record(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "data": {}}\n{"step": 2, "da')
    with Tracking("p", "e", "file", log_dir=tmp_path) as t:
        t.log({"x": 3}, step=3)
    lines = path.read_text().splitlines()
    assert lines[-1] == '{"step": 3, "data": {"x": 3}}' and lines[1] == '{"step": 2, "da'


def test_unknown_backend_lists_valid_ones():
    with pytest.raises(ValueError, match=r"\['swanlab'\].*'console', 'file', 'tensorboard', 'wandb', 'mlflow'"):
        Tracking("p", "e", ["console", "swanlab"])


def test_tensorboard_writes_events_and_counts_skipped(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    t = Tracking("p", "e", ["tensorboard"], log_dir=tmp_path)
    t.log({"a/b": 1.0, "note": "text"}, step=1)
    t.finish()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert t.logger["tensorboard"].num_skipped == 1


def test_tensorboard_resume_purges_the_steps_after_the_checkpoint(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    killed = Tracking("p", "e", ["tensorboard"], log_dir=tmp_path)
    for step in range(1, 6):
        killed.log({"x": float(step)}, step=step)
    killed.finish()   # the run is killed after logging step 5; its last checkpoint is step 3
    resumed = Tracking("p", "e", ["tensorboard"], log_dir=tmp_path)
    resumed.resumed(3)
    for step in (4, 5):
        resumed.log({"x": 10.0 * step}, step=step)
    resumed.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("x")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]


def test_missing_packages_give_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        Tracking("p", "e", ["tensorboard"], log_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match="pip install wandb"):
        Tracking("p", "e", ["wandb"], log_dir=tmp_path)


def _fake_wandb(calls):
    mod = types.ModuleType("wandb")
    mod.init = lambda **kw: calls.append(("init", kw))
    mod.log = lambda data, step: calls.append(("log", data, step))
    mod.finish = lambda: calls.append(("finish",))
    mod.Table = lambda columns, data: ("table", columns, data)
    return mod


@pytest.mark.parametrize("api_key, expected_mode", [(None, "offline"), ("k", None)])
def test_wandb_offline_without_key(tmp_path, monkeypatch, api_key, expected_mode):
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    if api_key:
        monkeypatch.setenv("WANDB_API_KEY", api_key)
    else:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    t = Tracking("proj", "exp", ["wandb"], config={"trainer": {"seed": 1}}, log_dir=tmp_path)
    t.log({"x": np.float64(2.0)}, step=4)
    t.log_generations([("q", "a", 1.0)], step=4)
    t.finish()
    t.finish()  # idempotent
    init = calls[0][1]
    assert init["mode"] == expected_mode and init["project"] == "proj" and init["config"] == {"trainer": {"seed": 1}}
    assert calls[1] == ("log", {"x": 2.0}, 4)
    assert calls[2][1]["val/generations"] == ("table", ["input", "output", "score"], [["q", "a", 1.0]])
    assert [c for c in calls if c[0] == "finish"] == [("finish",)]


def test_validation_generations_printed_cut_visibly_and_filed(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    out = io.StringIO()
    t = Tracking("p", "e", ["file"], log_dir=tmp_path)
    samples = [("1+1=?", "2" * 30, 1.0), ("2+2=?", "5", 0.0)]
    ValidationGenerationsLogger(t, max_chars=10, stream=out).log(samples, step=5)
    t.finish()
    text = out.getvalue()
    assert "step 5 (2 samples)" in text and "sample 2 | score 0" in text
    assert "2" * 10 + "... [+20 chars]" in text
    rec = json.loads((tmp_path / "generations.jsonl").read_text())
    assert rec["step"] == 5 and rec["samples"][1] == {"input": "2+2=?", "output": "5", "score": 0.0}
    assert text.count("sample 1 |") == 1


def test_tracking_log_generations_prints_on_console_once():
    out = io.StringIO()
    with Tracking("p", "e", ["console"], stream=out) as t:
        t.log_generations([("q1", "a1", 1.0), ("q2", "a2", 0.0)], step=2)
    text = out.getvalue()
    assert "step 2 (2 samples)" in text and text.count("[input]") == 2 and "a2" in text


def test_select_generations_is_deterministic_and_order_free():
    inputs, outputs, scores = list("edcba"), list("EDCBA"), [5, 4, 3, 2, 1]
    a = select_generations(inputs, outputs, scores, n=3)
    b = select_generations(inputs[::-1], outputs[::-1], scores[::-1], n=3)
    assert a == b and len(a) == 3 and all(s[0].upper() == s[1] for s in a)
    full = select_generations(inputs, outputs, scores, n=10)  # more than there are: all 5
    assert sorted(full) == sorted(zip(inputs, outputs, scores)) and full[:3] == a


def test_progress_bar_starts_at_resumed_step():
    bar = make_progress_bar(10, initial_step=4, disable=True)
    assert bar.n == 4 and bar.total == 10
    bar.close()
    with pytest.raises(ValueError, match="initial_step=11"):
        make_progress_bar(10, initial_step=11)


def test_mlflow_logs_to_a_local_file_store_under_the_log_dir(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install -e '.[mlflow]')")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # recorded, so the backend's own setting is undone after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    t = Tracking("proj", "exp", ["mlflow"], config={"trainer": {"seed": 1}}, log_dir=tmp_path / "logs")
    t.log(METRICS, step=1)
    t.log({"critic/score/mean": 0.5, "note": "text"}, step=2)
    t.log_generations([("q", "a", 1.0)], step=2)
    t.finish()
    store = tmp_path / "logs" / "mlruns"
    assert store.is_dir()
    client = mlflow.MlflowClient(tracking_uri=store.as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.75), (2, 0.5)]
    assert run.data.metrics["val-core/gsm8k/acc/mean_at_4"] == 0.5  # '@' is not legal in an mlflow metric name
    assert run.data.metrics["response_length/mean"] == 3.5 and "note" not in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "val_generations"} <= artifacts


def test_mlflow_honours_the_tracking_uri(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install -e '.[mlflow]')")
    import mlflow

    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store named by the user: their opt-in
    with Tracking("proj", "exp", ["mlflow"], log_dir=tmp_path / "logs") as t:
        t.log({"critic/score/mean": 1.0}, step=1)
    assert not (tmp_path / "logs" / "mlruns").exists()
    client = mlflow.MlflowClient(tracking_uri=elsewhere.as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.data.metrics["critic/score/mean"] == 1.0


def test_mlflow_missing_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"pip install 'hybridrl\[mlflow\]'"):
        Tracking("p", "e", ["mlflow"], log_dir=tmp_path)
