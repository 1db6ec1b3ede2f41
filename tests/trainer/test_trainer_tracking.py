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


def test_console_prints_one_compact_line_and_full_dict_at_debug(caplog):
    out = io.StringIO()
    with caplog.at_level(logging.DEBUG, logger="hybridrl.tracking"):
        t = Tracking("p", "e", ["console"], stream=out)
        t.log(METRICS, step=3)
        t.finish()
    lines = out.getvalue().splitlines()
    assert lines == ["step 3 | score 0.75 | pg_loss -0.125 | resp_len 3.5 | step_s 2 | tok/s/gpu 12346 | "
                     "val/gsm8k/acc/mean@4 0.5"]
    assert "actor/lr" in caplog.text  # everything is there at DEBUG
    assert format_console_line({}, 0) == "step 0"


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


def test_unknown_backend_lists_valid_ones():
    with pytest.raises(ValueError, match=r"\['mlflow'\].*'console', 'file', 'tensorboard', 'wandb'"):
        Tracking("p", "e", ["console", "mlflow"])


def test_tensorboard_writes_events_and_counts_skipped(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    t = Tracking("p", "e", ["tensorboard"], log_dir=tmp_path)
    t.log({"a/b": 1.0, "note": "text"}, step=1)
    t.finish()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert t.logger["tensorboard"].num_skipped == 1


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
