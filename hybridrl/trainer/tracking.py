"""Experiment tracking: one `Tracking` object fans each step's metrics out to the configured backends.

Backends (`trainer.logger`, verl's names): `console`, `file`, `tensorboard`, `wandb`.
Choices:
- console prints ONE compact line per step with a curated short list (score, reward, losses, lengths,
  times, throughput, memory, core validation numbers): a step's full dict is ~100 keys and unreadable
  in a terminal; the full dict goes to the `hybridrl.tracking` logger at DEBUG level;
- file writes verl's FileLogger format, one JSON object per line `{"step": N, "data": {...}}`, flushed
  every step (a killed run keeps every logged step). Path: `$VERL_FILE_LOGGER_PATH` if set, else
  `{log_dir}/metrics.jsonl`; appended to, so a resumed run continues the same file. Non-finite floats
  are written as JSON's NaN / Infinity tokens (Python's json and pandas read them);
- tensorboard: `torch.utils.tensorboard.SummaryWriter` in `$TENSORBOARD_DIR` or `{log_dir}/tensorboard`;
  non-numeric values are skipped with a warning naming them (scalars only there);
- wandb: offline mode when neither WANDB_MODE nor WANDB_API_KEY is set (no account, no network
  here); a missing package is an ImportError that says how to fix it, never a silent no-op;
- log_dir defaults to `logs/{project_name}/{experiment_name}`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

__all__ = ["Tracking", "ValidationGenerationsLogger", "select_generations", "make_progress_bar",
           "format_console_line", "SUPPORTED_BACKENDS"]

logger = logging.getLogger("hybridrl.tracking")

SUPPORTED_BACKENDS = ("console", "file", "tensorboard", "wandb")

# (metric key, short name) shown on the console line, in this order, when present.
CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("critic/rewards/mean", "reward"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/entropy", "entropy"),
    ("actor/pg_clipfrac", "clipfrac"),
    ("actor/grad_norm", "grad_norm"),
    ("critic/vf_loss", "vf_loss"),
    ("response_length/mean", "resp_len"),
    ("response_length/clip_ratio", "resp_clip"),
    ("timing_s/gen", "gen_s"),
    ("timing_s/update_actor", "upd_s"),
    ("timing_s/step", "step_s"),
    ("perf/throughput", "tok/s/gpu"),
    ("perf/max_memory_allocated_gb", "mem_gb"),
)


def _to_python(value: Any) -> Any:
    """Numpy / torch scalars and arrays → Python numbers and lists; anything else unchanged."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch here
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _fmt(value: Any) -> str:
    value = _to_python(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def format_console_line(data: dict[str, Any], step: int) -> str:
    """`step 3 | score 0.5 | ... | val/gsm8k/acc/mean@4 0.25` from the curated keys present in `data`."""
    parts = [f"step {step}"]
    parts += [f"{short} {_fmt(data[key])}" for key, short in CONSOLE_KEYS if key in data]
    parts += [f"{k.replace('val-core/', 'val/', 1)} {_fmt(v)}" for k, v in data.items() if k.startswith("val-core/")]
    return " | ".join(parts)


def _plain_config(config: Any) -> Any:
    if config is None:
        return None
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(config, DictConfig | ListConfig):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:  # the GPU machine has no omegaconf; configs there are plain dicts
        pass
    return config


class _ConsoleBackend:
    def __init__(self, stream: TextIO | None):
        self.stream = stream

    def log(self, data: dict, step: int) -> None:
        print(format_console_line(data, step), file=self.stream or sys.stdout, flush=True)
        logger.debug("step %d metrics: %s", step, {k: _to_python(v) for k, v in data.items()})

    def finish(self) -> None:
        pass


class _FileBackend:
    def __init__(self, log_dir: Path):
        env = os.environ.get("VERL_FILE_LOGGER_PATH")
        self.path = Path(env) if env else log_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fp = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        print(f"[tracking] file logger writing to {self.path}", flush=True)

    def log(self, data: dict, step: int) -> None:
        record = {"step": int(step), "data": {k: _to_python(v) for k, v in data.items()}}
        self.fp.write(json.dumps(record, default=str) + "\n")
        self.fp.flush()

    def finish(self) -> None:
        if not self.fp.closed:
            self.fp.close()


class _TensorboardBackend:
    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("trainer.logger includes 'tensorboard' but the tensorboard package is not "
                              "installed: `pip install tensorboard` or remove it from trainer.logger") from e
        self.dir = Path(os.environ.get("TENSORBOARD_DIR") or log_dir / "tensorboard")
        self.dir.mkdir(parents=True, exist_ok=True)
        print(f"[tracking] tensorboard logs in {self.dir}", flush=True)
        self.writer = SummaryWriter(str(self.dir))
        self.num_skipped = 0

    def log(self, data: dict, step: int) -> None:
        skipped = []
        for key, value in data.items():
            value = _to_python(value)
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

    def finish(self) -> None:
        self.writer.close()


class _WandbBackend:
    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: Path):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("trainer.logger includes 'wandb' but the wandb package is not installed: "
                              "`pip install wandb` or remove it from trainer.logger") from e
        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE") or (None if os.environ.get("WANDB_API_KEY") else "offline")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project_name, name=experiment_name, config=_plain_config(config),
                              dir=str(log_dir), mode=mode)
        self.mode = mode

    def log(self, data: dict, step: int) -> None:
        self.wandb.log({k: _to_python(v) for k, v in data.items()}, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        self.wandb.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.wandb.finish()


class Tracking:
    """Fan-out logger: `Tracking(project, experiment, ["console", "file"]).log(metrics, step)`; `finish()` at the end."""

    supported_backend = SUPPORTED_BACKENDS

    def __init__(self, project_name: str, experiment_name: str, default_backend: str | Sequence[str] = "console",
                 config: Any = None, log_dir: str | os.PathLike | None = None, stream: TextIO | None = None):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend or [])
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; valid ones are {list(SUPPORTED_BACKENDS)}")
        self.project_name, self.experiment_name = project_name, experiment_name
        self.log_dir = Path(log_dir) if log_dir is not None else Path("logs") / project_name / experiment_name
        self.logger: dict[str, Any] = {}
        for name in dict.fromkeys(backends):  # keep order, drop duplicates
            if name == "console":
                self.logger[name] = _ConsoleBackend(stream)
            elif name == "file":
                self.logger[name] = _FileBackend(self.log_dir)
            elif name == "tensorboard":
                self.logger[name] = _TensorboardBackend(self.log_dir)
            elif name == "wandb":
                self.logger[name] = _WandbBackend(project_name, experiment_name, config, self.log_dir)
        self._finished = False

    def log(self, data: dict[str, Any], step: int, backend: Sequence[str] | None = None) -> None:
        for name, backend_impl in self.logger.items():
            if backend is None or name in backend:
                backend_impl.log(data, step)

    def log_generations(self, samples: Sequence[Sequence[Any]], step: int, console: bool = True) -> None:
        """(input, output, score) samples to every backend: console prints them (unless console=False),
        file → generations.jsonl next to the metrics, tensorboard → text, wandb → table `val/generations`."""
        rows = [[_to_python(x) for x in s] for s in samples]
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
