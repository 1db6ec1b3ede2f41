"""The files a PPO/GRPO config names, checked together before anything starts.

`path_problems(config)` lists every missing or unusable path of a config at once (the actor's model directory, the
critic's and the reward model's where the run uses them, the train and validation files, the custom reward file),
each naming its key, the value and the command that makes it; `check_paths` raises them as one MissingPathsError.

Choices:
- One report, not the first problem: a run that stops on the model path, then on the train file, then on the
  validation file costs three tries for what one message can say.
- A path inside the demo's directory (`demo_home()`, where `hybridrl train` with no arguments builds its model and
  data, and what the packaged config points at) is named with the demo as the command that makes it; any other
  with the generic commands (`hybridrl assets tiny-model`, `hybridrl data make` / `data convert`).
- MissingPathsError is a ConfigError and a FileNotFoundError, so callers catching either see it.
- Existence and shape: a model directory holds config.json; a parquet data file's schema (read without its rows,
  milliseconds) has the columns and types the dataset needs, data.prompt_key's among them, and the column
  data.reward_fn_key names; the training files' rows (parquet footers, JSON Lines lines) fill one generation batch.
  Rows lost to overlong-prompt filtering, and JSON arrays, are the dataset's business once read.
"""

from __future__ import annotations

import os
from pathlib import Path

from hybridrl.config.errors import ConfigError
from hybridrl.config.sections import PPOConfig

__all__ = ["MissingPathsError", "batch_rows_problem", "check_paths", "demo_home", "file_rows", "files_problem",
           "model_dir_problem", "path_problems", "schema_problem"]

HOME_ENV = "HYBRIDRL_HOME"
OWN_RUN_DOC = "docs/your-own-run.md"


def demo_home() -> Path:
    """Where the embedded demo keeps its model, data and runs: $HYBRIDRL_HOME/demo (default ~/.cache/hybridrl/demo)."""
    return Path(os.path.expanduser(os.environ.get(HOME_ENV, "~/.cache/hybridrl"))) / "demo"


class MissingPathsError(ConfigError, FileNotFoundError):
    """Paths a config names that do not exist or cannot be used; `.errors` lists each (key, value, how to make it)."""


def _in_demo(path: str) -> bool:
    try:
        return Path(path).resolve().is_relative_to(demo_home().resolve())
    except OSError:
        return False


def _demo_hint() -> str:
    return "the demo's; `hybridrl train` with no arguments builds it there"


def model_dir_problem(path, key: str) -> str | None:
    """Why `path` (the value of `key`) is not a HF model directory holding config.json, or None when it is."""
    path = os.path.expanduser(str(path))
    where = Path(path)
    if not where.exists():
        how = _demo_hint() if _in_demo(path) else (
            f"a HF model directory: config.json, weights and tokenizer; `hybridrl assets tiny-model DIR` writes a "
            f"tiny one, {OWN_RUN_DOC} says what yours needs")
        return f"{key}={path!r} does not exist ({how})"
    if not where.is_dir():
        return f"{key}={path!r} is a file; it must be a HF model directory (config.json, weights, tokenizer)"
    if not (where / "config.json").is_file():
        found = sorted(p.name for p in where.iterdir())[:10]
        return (f"{key}={path!r}: the model directory has no config.json (it holds {found or 'nothing'}); a HF model "
                "directory needs config.json, weights and tokenizer")
    return None


def _as_list(value) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [os.path.expanduser(str(v)) for v in items]


def files_problem(value, key: str) -> str | None:
    """Which of the data files `value` (one path or a list, the value of `key`) do not exist, or None."""
    missing = [p for p in _as_list(value) if not Path(p).exists()]
    if not missing:
        return None
    if all(_in_demo(p) for p in missing):
        how = _demo_hint()
    else:
        how = ("`hybridrl data make TASK --out DIR` writes DIR/train.parquet and DIR/test.parquet; `hybridrl data "
               f"convert` turns JSONL, CSV or a datasets directory into one ({OWN_RUN_DOC})")
    if key == "data.val_files":
        how += "; data.val_files=null turns validation off"
    return f"{key}: {missing} not found ({how})"


# the batch's keys a row has whatever its file's columns (data/rl_dataset.py), which data.reward_fn_key may name
DERIVED_KEYS = ("data_source", "reward_model", "extra_info", "ability", "index", "interaction_kwargs")


def schema_problem(value, key: str, prompt_key: str, reward_fn_key: str) -> str | None:
    """What is wrong with the columns of the existing parquet files among `value` (the value of `key`), or None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hybridrl.data.rl_dataset import check_schema

    for path in _as_list(value):
        if not Path(path).is_file() or Path(path).suffix.lower() in (".json", ".jsonl"):
            continue
        try:
            schema = pq.read_schema(path)
            check_schema(path, schema, prompt_key)
        except (pa.ArrowInvalid, OSError) as e:
            return f"{key}: {path!r} cannot be read as parquet ({e})"
        except ValueError as e:
            return f"{key}: {e}"
        if reward_fn_key not in schema.names and reward_fn_key not in DERIVED_KEYS:
            return (f"data.reward_fn_key={reward_fn_key!r} names no column of {path!r} (columns: {schema.names}); "
                    "it selects each row's scorer by that column's value")
    return None


def file_rows(path: str) -> int | None:
    """Rows of a data file without reading its data: a parquet file's footer count, a JSON Lines file's non-blank
    lines; None for anything else (a JSON array, an unreadable file: the dataset reports those when it loads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".jsonl":
            with open(path, "rb") as f:
                return sum(1 for line in f if line.strip())
        if suffix != ".json":
            return pq.read_metadata(path).num_rows
    except (pa.ArrowInvalid, OSError):
        return None
    return None


def batch_rows_problem(config: PPOConfig) -> str | None:
    """Why the training files cannot fill one generation batch, counted before any prompt is filtered as overlong
    (train checks again after filtering), or None. Files that do not exist or cannot be counted are skipped."""
    d = config.data
    key, size = ("data.gen_batch_size", d.gen_batch_size) if d.gen_batch_size is not None else (
        "data.train_batch_size", d.train_batch_size)
    counts = [file_rows(p) for p in _as_list(d.train_files) if Path(p).is_file()]
    if not counts or None in counts:
        return None
    rows = sum(counts)
    usable = rows if d.train_max_samples == -1 else min(rows, d.train_max_samples)
    if usable >= size or rows == 0:  # files without rows: the dataset names them when it loads
        return None
    cap = f", of which data.train_max_samples={d.train_max_samples} are used" if usable < rows else ""
    return (f"{key}={size} is larger than the training files' {rows} rows{cap}: no full batch can be formed "
            f"(lower {key}, or add rows to data.train_files)")


def path_problems(config: PPOConfig) -> list[str]:
    """Every path problem of a PPO/GRPO config (see the module docstring), in the order a run would meet them."""
    problems = [model_dir_problem(config.actor_rollout_ref.model.path, "actor_rollout_ref.model.path")]
    if config.algorithm.adv_estimator == "gae":
        problems.append(model_dir_problem(config.critic.model.path, "critic.model.path"))
    rm = config.reward_model
    if rm.enable and rm.style == "model" and rm.model.path is not None:
        problems.append(model_dir_problem(rm.model.path, "reward_model.model.path"))
    d = config.data
    for key, value in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        problems.append(files_problem(value, key) or schema_problem(value, key, d.prompt_key, d.reward_fn_key))
    problems.append(batch_rows_problem(config))
    reward = config.custom_reward_function
    if reward.path and not Path(os.path.expanduser(reward.path)).is_file():
        problems.append(f"custom_reward_function.path={reward.path!r} does not exist (a Python file defining "
                        f"{reward.name}(data_source, solution_str, ground_truth, extra_info=None); null = the built-in "
                        "scorers by data_source)")
    return [p for p in problems if p]


def check_paths(config: PPOConfig) -> None:
    """Raises MissingPathsError listing every path problem of `config`."""
    problems = path_problems(config)
    if problems:
        raise MissingPathsError(problems)
