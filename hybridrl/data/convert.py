"""`hybridrl data convert SRC --out FILE.parquet --prompt-key COL --answer-key COL --data-source NAME`: your data
into the verl parquet schema the trainer reads (`prompt` as chat messages, `data_source`,
`reward_model.ground_truth`, `extra_info`; docs/your-own-run.md).

SRC is a JSONL file (one JSON object a line), a CSV file (a header row), a directory written by `datasets`'
`save_to_disk` (read only when the `datasets` package is importable; it is not a dependency), or a parquet file or
folder of them as a Hugging Face dataset repository holds them (`data/train-00000-of-00001.parquet`).

Choices:
- Each row: `prompt` = [system message (--system), user message]; the user message is the prompt column's text,
  or --prompt-template filled with the row's columns (`"{question}\nAnswer after ####."`). A prompt column that
  already holds chat messages ([{role, content}, ...]) is taken as it is. `reward_model` = {style: rule,
  ground_truth: the answer column as text, or only what follows the last --answer-after marker (GSM8K's
  `#### 72` gives `72`)}. `answer` = the answer column's full text (an SFT target, as `data make` writes).
  `extra_info` = {split, index, and the --extra-keys columns}. `data_source` (--data-source) picks the reward
  function: a name the built-in scorers know, or any name your custom_reward_function reads.
- Splits: a `datasets` DatasetDict or a parquet folder holding several splits needs --split (the folder's files
  are matched by name: `train-*.parquet`, `train.parquet`, or under a `train/` directory); one table needs none.
- Every problem names the option, the value and what was found instead (the columns SRC has, the row whose
  prompt or answer is empty), and nothing is written then: a half-converted file would train on less data than
  it seems to.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hybridrl.data.tasks.base import PROMPT_TYPE, REWARD_MODEL_TYPE

__all__ = ["ConvertError", "convert", "read_source", "register"]


class ConvertError(ValueError):
    """A source or option `data convert` cannot use; the message names it."""


def _jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConvertError(f"{path}: line {n} is not JSON ({e.msg}); JSONL needs one JSON object a line") from e
        if not isinstance(row, dict):
            raise ConvertError(f"{path}: line {n} is a JSON {type(row).__name__}, not an object of columns")
        rows.append(row)
    return rows


def _parquet_files(folder: Path, split: str | None) -> list[Path]:
    files = sorted(folder.rglob("*.parquet"))
    if split is not None:
        files = [f for f in files if f.stem == split or f.name.startswith(f"{split}-") or split in f.parent.parts]
    return files


def _datasets_dir(path: Path, split: str | None) -> list[dict]:
    try:
        import datasets
    except ImportError as e:
        raise ConvertError(f"{path} is a `datasets` directory (save_to_disk) but the datasets package is not "
                           "installed: `pip install datasets`, or export it to JSONL or parquet first") from e
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split is None or split not in loaded:
            raise ConvertError(f"{path} holds the splits {sorted(loaded)}: choose one with --split"
                               + (f" (--split {split!r} is not among them)" if split is not None else ""))
        loaded = loaded[split]
    return loaded.to_list()


def read_source(src: str | Path, split: str | None = None) -> list[dict]:
    """The rows of `src` (see the module docstring for what it may be), as dicts of column values."""
    path = Path(src).expanduser()
    if not path.exists():
        raise ConvertError(f"{src}: does not exist")
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return _datasets_dir(path, split)
        files = _parquet_files(path, split)
        if not files:
            all_files = _parquet_files(path, None)
            if all_files and split is not None:
                raise ConvertError(f"{src}: no parquet file of split {split!r} (files: "
                                   f"{[str(f.relative_to(path)) for f in all_files][:10]})")
            raise ConvertError(f"{src}: a directory without parquet files nor a `datasets` save_to_disk layout "
                               "(dataset_dict.json or state.json)")
        splits = {f.stem.split("-")[0] for f in files}
        if split is None and len(splits) > 1:
            raise ConvertError(f"{src} holds parquet files of several splits {sorted(splits)}: choose one with --split")
        return [row for f in files for row in pq.read_table(f).to_pylist()]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _jsonl(path)
    if suffix in (".csv", ".tsv"):
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ","))
    if suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    raise ConvertError(f"{src}: unknown format {suffix or '(no suffix)'!r}; give a .jsonl, .csv, .tsv or .parquet "
                       "file, a parquet folder or a `datasets` save_to_disk directory")


def _column(rows: list[dict], key: str, option: str, src) -> None:
    if rows and key not in rows[0]:
        raise ConvertError(f"{option} {key!r}: {src} has no column {key!r} (its columns: {sorted(rows[0])})")


def _is_chat(value) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in value)


def _prompt(row: dict, i: int, prompt_key: str, template: str | None, system: str | None) -> list[dict]:
    value = row[prompt_key]
    if _is_chat(value) and template is None:
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    else:
        try:
            text = template.format_map(row) if template is not None else value
        except KeyError as e:
            raise ConvertError(f"--prompt-template names the column {e.args[0]!r}, which row {i} does not have "
                               f"(its columns: {sorted(row)})") from e
        if not isinstance(text, str) or not text.strip():
            raise ConvertError(f"--prompt-key {prompt_key!r}: row {i} has an empty or non-text prompt {value!r}")
        messages = [{"role": "user", "content": text}]
    return ([{"role": "system", "content": system}] if system else []) + messages


def _ground_truth(row: dict, i: int, answer_key: str, after: str | None) -> tuple[str, str]:
    value = row[answer_key]
    if value is None or str(value).strip() == "":
        raise ConvertError(f"--answer-key {answer_key!r}: row {i} has no answer ({value!r})")
    text = str(value)
    if after is None:
        return text.strip(), text
    if after not in text:
        raise ConvertError(f"--answer-after {after!r}: row {i}'s answer has no {after!r} ({text[:80]!r})")
    return text.rsplit(after, 1)[1].strip(), text


def convert(src: str | Path, out: str | Path, prompt_key: str, answer_key: str, data_source: str,
            split: str | None = None, prompt_template: str | None = None, system: str | None = None,
            answer_after: str | None = None, extra_keys: list[str] = (), ability: str = "") -> Path:
    """Write `src`'s rows to the parquet file `out` in the trainer's schema (module docstring); returns `out`."""
    if not data_source:
        raise ConvertError("--data-source must be a non-empty name (it selects the reward function)")
    rows = read_source(src, split)
    if not rows:
        raise ConvertError(f"{src}: no rows" + (f" in split {split!r}" if split else ""))
    for key, option in ((prompt_key, "--prompt-key"), (answer_key, "--answer-key"),
                        *((k, "--extra-keys") for k in extra_keys)):
        _column(rows, key, option, src)
    out_rows = []
    for i, row in enumerate(rows):
        ground_truth, answer = _ground_truth(row, i, answer_key, answer_after)
        out_rows.append({
            "data_source": data_source, "prompt": _prompt(row, i, prompt_key, prompt_template, system),
            "ability": ability, "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split or "train", "index": i, **{k: row[k] for k in extra_keys}},
            "answer": answer})
    extra = pa.array([r["extra_info"] for r in out_rows])   # the --extra-keys columns' own types
    table = pa.table({"data_source": pa.array([r["data_source"] for r in out_rows], pa.string()),
                      "prompt": pa.array([r["prompt"] for r in out_rows], PROMPT_TYPE),
                      "ability": pa.array([r["ability"] for r in out_rows], pa.string()),
                      "reward_model": pa.array([r["reward_model"] for r in out_rows], REWARD_MODEL_TYPE),
                      "extra_info": extra, "answer": pa.array([r["answer"] for r in out_rows], pa.string())})
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return out


def run_convert(args: argparse.Namespace) -> int:
    extra = [k for k in (args.extra_keys or "").split(",") if k]
    try:
        out = convert(args.src, args.out, args.prompt_key, args.answer_key, args.data_source, split=args.split,
                      prompt_template=args.prompt_template, system=args.system, answer_after=args.answer_after,
                      extra_keys=extra, ability=args.ability)
    except ConvertError as e:
        print(f"hybridrl: error: data convert: {e}", file=sys.stderr)
        return 1
    print(f"wrote {pq.read_metadata(out).num_rows} rows to {out} (data_source {args.data_source!r})")
    return 0


def register(data_sub) -> argparse.ArgumentParser:
    """`data convert` under the `data` command's subparsers."""
    p = data_sub.add_parser("convert", help="convert JSONL / CSV / a datasets directory / parquet into the "
                                            "trainer's parquet schema")
    p.add_argument("src", help="a .jsonl, .csv, .tsv or .parquet file, a parquet folder, or a `datasets` "
                               "save_to_disk directory")
    p.add_argument("--out", required=True, help="the parquet file to write (e.g. ~/data/my_task/train.parquet)")
    p.add_argument("--prompt-key", required=True, help="the column holding the question (text or chat messages)")
    p.add_argument("--answer-key", required=True, help="the column holding the answer (reward_model.ground_truth)")
    p.add_argument("--data-source", required=True, help="the name that selects the reward function")
    p.add_argument("--split", default=None, help="the split to take from a DatasetDict or a multi-split folder")
    p.add_argument("--prompt-template", default=None,
                   help="the user message, filled with the row's columns: '{question}\\nAnswer after ####.'")
    p.add_argument("--system", default=None, help="a system message before every prompt")
    p.add_argument("--answer-after", default=None,
                   help="keep only the answer's text after the last occurrence of this marker (e.g. '####')")
    p.add_argument("--extra-keys", default=None, help="comma-separated columns to keep in extra_info")
    p.add_argument("--ability", default="", help="the `ability` column (verl's; informational)")
    p.set_defaults(func=run_convert)
    return p
