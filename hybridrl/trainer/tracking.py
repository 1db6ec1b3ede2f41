"""Experiment tracking: one `Tracking` object fans each step's metrics out to the configured backends.

Backends (`trainer.logger`, verl's names): `console`, `file`, `tensorboard`, `wandb`, `mlflow`.
Choices:
- console prints ONE short line per step: `step k/N`, the time since logging began and an ETA (the mean time of the
  steps this process ran, times the steps left), then a curated few numbers (score, entropy, response length,
  step time, memory, core validation numbers). A step's full dict is ~100 keys and unreadable in a terminal:
  it goes to the file logger (the packaged default logs to both) and to the `hybridrl.tracking` logger at
  DEBUG level. A step with none of the curated keys (the dataset statistics logged at step 0) prints nothing;
- file writes verl's FileLogger format, one JSON object per line `{"step": N, "data": {...}}`, flushed
  every step (a killed run keeps every logged step). Path: `$VERL_FILE_LOGGER_PATH` if set, else
  `{log_dir}/metrics.jsonl`; appended to, so a resumed run continues the same file. Non-finite floats
  are written as JSON's NaN / Infinity tokens (Python's json and pandas read them);
- tensorboard: `torch.utils.tensorboard.SummaryWriter` in `$TENSORBOARD_DIR` or `{log_dir}/tensorboard`;
  non-numeric values are skipped with a warning naming them (scalars only there); a resume writes a purge mark, so
  the steps a killed run logged after its checkpoint are not shown twice;
- wandb: offline mode when neither WANDB_MODE nor WANDB_API_KEY is set (no account, no network
  here); a missing package is an ImportError that says how to fix it, never a silent no-op;
- mlflow: `$MLFLOW_TRACKING_URI` when set (a server, a database, a directory), else a local file store in
  `{log_dir}/mlruns` (`mlflow ui --backend-store-uri file://...` shows it; MLFLOW_ALLOW_FILE_STORE=true, which
  mlflow 3 asks for before it opens a file store, is set for it unless set already). project_name is the experiment,
  experiment_name the run's name; the resolved config is the run's `config.json` artifact (hundreds of keys exceed
  what mlflow's params take in one batch) and validation generations `val_generations/step_N.json`. Metric names
  are made legal for mlflow (`@` -> `_at_`, other characters it refuses -> `_`); non-numeric values are skipped
  with a warning, as for tensorboard. Through MlflowClient, not mlflow's module-level active run, so a process
  that runs mlflow for its own purposes keeps its run;
- log_dir defaults to `logs/{project_name}/{experiment_name}`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

__all__ = ["Tracking", "ValidationGenerationsLogger", "select_generations", "make_progress_bar",
           "format_console_line", "format_duration", "logger_names", "SUPPORTED_BACKENDS"]

logger = logging.getLogger("hybridrl.tracking")

SUPPORTED_BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow")


def logger_names(value) -> list[str]:
    """`trainer.logger` as a list: verl takes one backend's name or a list of them."""
    return [value] if isinstance(value, str) else list(value)

# (metric key, short name) shown on the console line, in this order, when present: what tells whether a run
# learns (score, entropy, length; the critic's loss for PPO) and what it costs (step time, memory)
CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("actor/entropy", "entropy"),
    ("critic/vf_loss", "vf_loss"),
    ("response_length/mean", "resp_len"),
    ("timing_s/step", "step_s"),
    ("perf/max_memory_allocated_gb", "mem_gb"),
)


def to_python(value: Any) -> Any:
    """Numpy / torch scalars and arrays → Python numbers and lists; anything else unchanged."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch here
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _fmt(value: Any) -> str:
    value = to_python(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def format_duration(seconds: float) -> str:
    """`42s`, `3:07` (m:ss), `1:02:03` (h:mm:ss)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _curated(data: dict[str, Any]) -> list[str]:
    parts = [f"{short} {_fmt(data[key])}" for key, short in CONSOLE_KEYS if key in data]
    return parts + [f"{k.replace('val-core/', 'val/', 1)} {_fmt(v)}" for k, v in data.items()
                    if k.startswith("val-core/")]


def format_console_line(data: dict[str, Any], step: int, total_steps: int | None = None,
                        elapsed_s: float | None = None, eta_s: float | None = None) -> str:
    """`step 3/60 | 0:42 elapsed, ETA 13:20 | score 0.5 | ... | val/gsm8k/acc/mean@4 0.25` from the curated keys
    present in `data` (the total, elapsed time and ETA where given)."""
    parts = [f"step {step}" + (f"/{total_steps}" if total_steps else "")]
    if elapsed_s is not None:
        parts.append(f"{format_duration(elapsed_s)} elapsed" + (f", ETA {format_duration(eta_s)}"
                                                                  if eta_s is not None else ""))
    return " | ".join(parts + _curated(data))


def _plain_config(config: Any) -> Any:
    """A typed config as its plain tree (what wandb and mlflow store); a dict or None as given."""
    return config.to_dict() if hasattr(config, "to_dict") else config


def _require(module: str, backend: str, install: str):
    """The module a logger backend needs; a missing package is an ImportError that says how to fix it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"trainer.logger includes '{backend}' but the {backend} package is not installed: "
                          f"`{install}` or remove it from trainer.logger") from e


class _ConsoleBackend:
    def __init__(self, stream: TextIO | None, total_steps: int | None, clock=time.monotonic):
        self.stream, self.total_steps, self.clock = stream, total_steps, clock
        self.start = clock()
        self.base: tuple[int, float] | None = None   # (step, time) the ETA's rate is measured from

    def _eta(self, step: int, now: float) -> float | None:
        if self.base is None:  # a resumed run's first step: measured from when logging started
            self.base = (step - 1, self.start)
        base_step, base_time = self.base
        if not self.total_steps or step <= base_step:
            return None
        return (now - base_time) / (step - base_step) * max(0, self.total_steps - step)

    def log(self, data: dict, step: int) -> None:
        logger.debug("step %d metrics: %s", step, {k: to_python(v) for k, v in data.items()})
        now = self.clock()
        if step <= 0:  # before training (dataset statistics, validation): training's time starts after it
            self.base = (step, now)
            if not _curated(data):
                return
            line = format_console_line(data, step, self.total_steps)
        else:
            line = format_console_line(data, step, self.total_steps, now - self.start, self._eta(step, now))
        print(line, file=self.stream or sys.stdout, flush=True)

    def finish(self) -> None:
        pass


class _FileBackend:
    """metrics.jsonl, one JSON record a line, appended across runs of one directory. A record is written whole in
    one write; a file whose last line was cut (a full disk, a kill) gets a line break first, so the next record is
    never glued onto it. A resume drops the records of steps after the checkpoint (`resumed`): the killed run logged
    them, the resumed one logs them again."""

    def __init__(self, log_dir: Path):
        env = os.environ.get("VERL_FILE_LOGGER_PATH")
        self.path = Path(env) if env else log_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fp = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        if self.fp.tell() and not _ends_with_newline(self.path):
            self._write("\n")
        print(f"[tracking] file logger writing to {self.path}", flush=True)

    def _write(self, text: str) -> None:
        try:
            self.fp.write(text)
            self.fp.flush()
        except OSError as e:
            raise OSError(e.errno, f"trainer.logger 'file': writing {self.path} failed ({e.strerror}); free space "
                                   "or drop 'file' from trainer.logger") from e

    def log(self, data: dict, step: int) -> None:
        record = {"step": int(step), "data": {k: to_python(v) for k, v in data.items()}}
        self._write(json.dumps(record, default=str) + "\n")

    def resumed(self, step: int) -> None:
        self.fp.close()   # the rewrite replaces the file: append to the new one
        for path in (self.path, self.path.with_name("generations.jsonl")):
            _drop_records_after(path, step)
        self.fp = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()

    def finish(self) -> None:
        if not self.fp.closed:
            self.fp.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _drop_records_after(path: Path, step: int) -> int:
    """Rewrite a JSONL log without its records of steps > `step` (and lines that do not parse: a cut last line);
    the file is replaced atomically. Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            keep = int(json.loads(line)["step"]) <= step
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += bool(line.strip())
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
        logger.warning("%s: dropped %d record(s) of steps after %d, logged by the run this one resumes", path,
                       dropped, step)
    return dropped


class _TensorboardBackend:
    def __init__(self, log_dir: Path):
        self.SummaryWriter = _require("torch.utils.tensorboard", "tensorboard", "pip install tensorboard").SummaryWriter
        self.dir = Path(os.environ.get("TENSORBOARD_DIR") or log_dir / "tensorboard")
        self.dir.mkdir(parents=True, exist_ok=True)
        print(f"[tracking] tensorboard logs in {self.dir}", flush=True)
        self.writer = self.SummaryWriter(str(self.dir))
        self.num_skipped = 0

    def log(self, data: dict, step: int) -> None:
        skipped = []
        for key, value in data.items():
            value = to_python(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
            else:
                skipped.append(key)
        if skipped:
            self.num_skipped += len(skipped)
            logger.warning("tensorboard: step %d: %d non-scalar values not logged: %s", step, len(skipped), skipped)
        self.writer.flush()

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)
        self.writer.flush()

    def resumed(self, step: int) -> None:
        """Reopen the writer with a purge mark: TensorBoard drops the events of steps after `step` that the killed
        run wrote, where the resumed run writes them again."""
        self.writer.close()
        self.writer = self.SummaryWriter(str(self.dir), purge_step=step + 1)

    def finish(self) -> None:
        self.writer.close()


class _WandbBackend:
    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: Path):
        wandb = _require("wandb", "wandb", "pip install wandb")
        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE") or (None if os.environ.get("WANDB_API_KEY") else "offline")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project_name, name=experiment_name, config=_plain_config(config),
                              dir=str(log_dir), mode=mode)
        self.mode = mode

    def log(self, data: dict, step: int) -> None:
        self.wandb.log({k: to_python(v) for k, v in data.items()}, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        self.wandb.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.wandb.finish()


class _MlflowBackend:
    _ILLEGAL = re.compile(r"[^\w\-. /:]")   # what mlflow accepts in a metric name: alphanumerics, _ - . space / :

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: Path):
        mlflow = _require("mlflow", "mlflow", "pip install 'hybridrl[mlflow]'")
        from mlflow.entities import Metric

        self.metric = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            store = (log_dir / "mlruns").resolve()
            store.mkdir(parents=True, exist_ok=True)
            uri = store.as_uri()
            # mlflow >= 3.x refuses a file store unless this is set (it would have a database instead); the run
            # directory's own store is plain files that need no server or schema migrations (a SQLite store
            # spends seconds creating its tables and logs about it). A value the user set wins.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project_name)
        self.run_id = self.client.create_run(experiment_id, run_name=experiment_name).info.run_id
        if config is not None:
            self.client.log_dict(self.run_id, _plain_config(config), "config.json")
        print(f"[tracking] mlflow run {self.run_id} ({project_name}/{experiment_name}) in {uri}", flush=True)

    @classmethod
    def key(cls, name: str) -> str:
        return cls._ILLEGAL.sub("_", name.replace("@", "_at_"))

    def log(self, data: dict, step: int) -> None:
        now = int(time.time() * 1000)
        metrics, skipped = [], []
        for key, value in data.items():
            value = to_python(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics.append(self.metric(self.key(key), float(value), now, int(step)))
            else:
                skipped.append(key)
        if skipped:
            logger.warning("mlflow: step %d: %d non-scalar values not logged: %s", step, len(skipped), skipped)
        for i in range(0, len(metrics), 1000):  # mlflow's limit of metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_generations(self, rows: list[list], step: int) -> None:
        self.client.log_dict(self.run_id, [{"input": r[0], "output": r[1], "score": r[2]} for r in rows],
                             f"val_generations/step_{int(step)}.json")

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


class Tracking:
    """Fan-out logger: `Tracking(project, experiment, ["console", "file"]).log(metrics, step)`; `finish()` at the end."""

    supported_backend = SUPPORTED_BACKENDS

    def __init__(self, project_name: str, experiment_name: str, default_backend: str | Sequence[str] = "console",
                 config: Any = None, log_dir: str | os.PathLike | None = None, stream: TextIO | None = None,
                 total_steps: int | None = None):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend or [])
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; valid ones are {list(SUPPORTED_BACKENDS)}")
        self.project_name, self.experiment_name = project_name, experiment_name
        self.log_dir = Path(log_dir) if log_dir is not None else Path("logs") / project_name / experiment_name
        self.logger: dict[str, Any] = {}
        for name in dict.fromkeys(backends):  # keep order, drop duplicates
            if name == "console":
                self.logger[name] = _ConsoleBackend(stream, total_steps)
            elif name == "file":
                self.logger[name] = _FileBackend(self.log_dir)
            elif name == "tensorboard":
                self.logger[name] = _TensorboardBackend(self.log_dir)
            elif name == "wandb":
                self.logger[name] = _WandbBackend(project_name, experiment_name, config, self.log_dir)
            elif name == "mlflow":
                self.logger[name] = _MlflowBackend(project_name, experiment_name, config, self.log_dir)
        self._finished = False

    def log(self, data: dict[str, Any], step: int, backend: Sequence[str] | None = None) -> None:
        for name, backend_impl in self.logger.items():
            if backend is None or name in backend:
                backend_impl.log(data, step)

    def resumed(self, step: int) -> None:
        """A run resumed from the checkpoint of `step`: the file backend drops the records logged after it and
        tensorboard purges them. wandb and mlflow start a new run in each process, so nothing is logged twice into
        one run there."""
        for name in ("file", "tensorboard"):
            if name in self.logger:
                self.logger[name].resumed(step)

    def log_generations(self, samples: Sequence[Sequence[Any]], step: int, console: bool = True) -> None:
        """(input, output, score) samples to every backend: console prints them (unless console=False),
        file → generations.jsonl next to the metrics, tensorboard → text, wandb → table `val/generations`."""
        rows = [[to_python(x) for x in s] for s in samples]
        if console and "console" in self.logger:
            ValidationGenerationsLogger(stream=self.logger["console"].stream).log(samples, step)
        if "file" in self.logger:
            path = self.logger["file"].path.with_name("generations.jsonl")
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": int(step), "samples": [
                    {"input": r[0], "output": r[1], "score": r[2]} for r in rows]}, default=str) + "\n")
        if "tensorboard" in self.logger:
            text = "\n\n---\n\n".join(f"**Input:** {r[0]}\n\n**Output:** {r[1]}\n\n**Score:** {r[2]}" for r in rows)
            self.logger["tensorboard"].log_text("val/generations", text, step)
        if "wandb" in self.logger:
            self.logger["wandb"].log_table("val/generations", ["input", "output", "score"], rows, step)
        if "mlflow" in self.logger:
            self.logger["mlflow"].log_generations(rows, step)

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        for backend_impl in self.logger.values():
            backend_impl.finish()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


def select_generations(inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float], n: int,
                       seed: int = 42) -> list[tuple[str, str, float]]:
    """verl's choice of which validation samples to show: sort by input, shuffle with a fixed seed, keep n
    (the same prompts are shown at every validation, so their outputs can be compared over training)."""
    samples = sorted(zip(inputs, outputs, scores), key=lambda s: s[0])
    np.random.RandomState(seed).shuffle(samples)
    return [tuple(s) for s in samples[: max(0, n)]]


class ValidationGenerationsLogger:
    """Prints (input, output, score) validation samples, and hands them to a Tracking's other backends
    (`Tracking.log_generations` does the same from the Tracking side).

    Long texts are cut at `max_chars`, and the cut is shown (`... [+N chars]`), never silent."""

    def __init__(self, tracking: Tracking | None = None, max_chars: int = 600, stream: TextIO | None = None):
        if max_chars < 1:
            raise ValueError(f"ValidationGenerationsLogger: max_chars must be >= 1, got {max_chars}")
        self.tracking, self.max_chars, self.stream = tracking, max_chars, stream

    def _cut(self, text: Any) -> str:
        text = str(text)
        return text if len(text) <= self.max_chars else f"{text[: self.max_chars]}... [+{len(text) - self.max_chars} chars]"

    def log(self, samples: Sequence[Sequence[Any]], step: int) -> None:
        if not samples:
            return
        stream = self.stream or sys.stdout
        print(f"===== validation generations, step {step} ({len(samples)} samples) =====", file=stream)
        for i, (inp, out, score) in enumerate(samples):
            print(f"--- sample {i + 1} | score {_fmt(score)}\n[input]\n{self._cut(inp)}\n[output]\n{self._cut(out)}",
                  file=stream)
        stream.flush()
        if self.tracking is not None:
            self.tracking.log_generations(samples, step, console=False)  # printed above already


def make_progress_bar(total_steps: int, initial_step: int = 0, desc: str = "Training Progress", **kwargs):
    """tqdm bar over training steps, starting at `initial_step` (a resumed run shows its real position)."""
    from tqdm.auto import tqdm

    if total_steps < 0 or initial_step < 0 or initial_step > total_steps:
        raise ValueError(f"make_progress_bar: need 0 <= initial_step <= total_steps, got "
                         f"initial_step={initial_step}, total_steps={total_steps}")
    return tqdm(total=total_steps, initial=initial_step, desc=desc, dynamic_ncols=True, **kwargs)
