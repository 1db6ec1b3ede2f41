"""RLHFDataset: verl-schema parquet files → tokenized, left-padded prompt rows.

Choices:
- Read with pyarrow (no pandas/datasets dependency): parquet, and JSON (`.json` / `.jsonl`: JSON Lines or one
  array of objects) as verl reads both; the arrow schema is checked before any row is used, so a missing column or
  a wrong type fails at startup with the file and column named.
  Required: `prompt` (data.prompt_key; list of messages with a string `role` and a string `content`, null only
  in a message with `tool_calls`),
  `data_source` (string, or a dictionary-encoded string as pandas writes a categorical), `reward_model` (struct with
  `ground_truth`). Optional: `ability` (string, default ""), `extra_info` (struct); a column with no values at all
  (arrow type null) is read as absent. Other columns are passed on with each row. A parquet as verl's
  examples/data_preprocess/*.py write it loads unchanged.
- Messages go to the chat template with all their fields (`tool_calls`, `name`, `tool_call_id`, ...), as verl
  passes them; fields that are null in a message (arrow gives every message the union of the fields) are left out.
- Multimodal rows (values in the data.image_key or data.video_key column, verl's `images` / `videos`) are refused,
  naming the file, column and first row: prompts here are text only, and training on them as text would be wrong.
- Prompts are rendered with `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)` (plus
  data.apply_chat_template_kwargs, and `tools=` — the tool schemas of a multi-turn run, which the template lists in
  the system message) and
  tokenized without extra special tokens (the template already holds them) — once, at construction, because
  filtering needs the lengths anyway.
- Overlong prompts: `filter_overlong_prompts=True` drops them and counts them (`num_filtered`, logged);
  otherwise `truncation` decides: error (ValueError naming the row) | left (keep the end) | right (keep the
  start) | middle (keep both ends, as verl); truncated rows are counted in `num_truncated`. Both counts are logged as `data/filtered_prompts` and
  `data/truncated_prompts` (`dataset_metrics`, with the run's first logged record; the validation set's as
  `val-aux/data/*`) and returned in `run_ppo`'s summary.
- `max_samples` (data.train_max_samples / val_max_samples) keeps at most that many of the files' rows before
  anything else, as verl does: a random subset seeded by data.seed with data.shuffle, else the first rows.
- Rows are left-padded to max_prompt_length with pad_token_id; position_ids = cumsum(mask) - 1 clipped at 0
  (docs/CONTRACTS.md).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import torch

from hybridrl.data.dataloader import StatefulDataLoader  # re-exported: callers import it from here too
from hybridrl.protocol import DataProto, collate_rows

__all__ = ["RLHFDataset", "StatefulDataLoader", "collate_fn", "dataset_metrics", "read_rows", "select_rows"]

log = logging.getLogger(__name__)
TRUNCATION_MODES = ("error", "left", "right", "middle")



def _cfg(data_config, key, default):
    if data_config is None:
        return default
    getter = getattr(data_config, "get", None)
    value = getter(key, default) if getter else getattr(data_config, key, default)
    return default if value is None else value


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_text(t: pa.DataType) -> bool:
    """A string column, plain or dictionary-encoded (a pandas categorical)."""
    return _is_string(t) or (pa.types.is_dictionary(t) and _is_string(t.value_type))


def check_schema(path: str, schema: pa.Schema, prompt_key: str) -> None:
    """ValueError naming the file and column where `schema` lacks what the dataset needs."""
    def fail(column, rule):
        raise ValueError(f"{path}: column {column!r} {rule}; columns: {schema.names}")

    for col in (prompt_key, "data_source", "reward_model"):
        if col not in schema.names:
            fail(col, "is missing (required by the verl data schema)")
    t = schema.field(prompt_key).type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
    item = t.value_type if is_list else None
    if not (is_list and pa.types.is_struct(item) and all(item.get_field_index(k) >= 0 for k in ("role", "content"))
            and _is_string(item.field("role").type)
            and (_is_string(item.field("content").type) or pa.types.is_null(item.field("content").type))):
        fail(prompt_key, f"must be a list of {{role: string, content: string, ...}}, got type {t}")
    if not _is_text(schema.field("data_source").type):
        fail("data_source", f"must be a string, got type {schema.field('data_source').type}")
    t = schema.field("reward_model").type
    if not (pa.types.is_struct(t) and t.get_field_index("ground_truth") >= 0):
        fail("reward_model", f"must be a struct with a 'ground_truth' field, got type {t}")
    for column, check, kind in (("ability", _is_text, "a string"), ("extra_info", pa.types.is_struct, "a struct")):
        if column in schema.names and not (check(schema.field(column).type)
                                           or pa.types.is_null(schema.field(column).type)):
            fail(column, f"must be {kind}, got type {schema.field(column).type}")


def _read_table(path: Path) -> pa.Table:
    """A parquet file, or a JSON one (JSON Lines, or one array of objects)."""
    if path.suffix.lower() not in (".json", ".jsonl"):
        try:
            return pq.read_table(path)
        except pa.ArrowInvalid as e:
            raise ValueError(f"data file {str(path)!r} is not a parquet file ({e}); data files are parquet, or JSON "
                             "named *.json / *.jsonl") from e
    try:
        return pj.read_json(path)
    except pa.ArrowInvalid as lines_error:
        try:
            records = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            records = None
        if not (isinstance(records, list) and all(isinstance(r, dict) for r in records)):
            raise ValueError(f"data file {str(path)!r} is neither JSON Lines ({lines_error}) nor a JSON array of "
                             "objects") from lines_error
        return pa.Table.from_pylist(records)


def _refuse_multimodal(path: str, table: pa.Table, columns: tuple[str, ...]) -> None:
    for column in columns:
        if column not in table.column_names:
            continue
        held = [r for r, v in enumerate(table.column(column).to_pylist()) if v]
        if held:
            raise ValueError(f"{path}: column {column!r} holds {column} in {len(held)} rows (first: row {held[0]}); "
                             "multimodal prompts are not supported (text chats only): drop the column or train on "
                             "text-only rows")


def read_rows(files, prompt_key: str = "prompt", multimodal_keys: tuple[str, ...] = ("images", "videos")) -> list[dict]:
    """All rows of one path or a list of paths, schema-checked, rows with values in a `multimodal_keys` column
    refused; each row remembers its file."""
    paths = [files] if isinstance(files, (str, Path)) else list(files)
    if not paths:
        raise ValueError("data files: empty list of data files")
    rows = []
    for p in paths:
        path = Path(p).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"data file {str(p)!r} not found")
        table = _read_table(path)
        check_schema(str(path), table.schema, prompt_key)
        _refuse_multimodal(str(path), table, multimodal_keys)
        null_columns = [f.name for f in table.schema if pa.types.is_null(f.type)]   # no values: read as absent
        for r, row in enumerate(table.drop_columns(null_columns).to_pylist()):   # every column, as verl keeps them
            row["_file"], row["_row"] = str(path), r
            rows.append(row)
    return rows


def select_rows(rows: list, max_samples: int, shuffle: bool, seed: int) -> list:
    """At most `max_samples` of `rows` (-1: all): a random subset seeded by `seed` with `shuffle`, else the first
    ones (verl's data.train_max_samples / val_max_samples)."""
    if max_samples == -1 or max_samples >= len(rows):
        return rows
    if max_samples <= 0:
        raise ValueError(f"max_samples={max_samples}: must be -1 (all rows) or positive")
    if not shuffle:
        return rows[:max_samples]
    picked = np.random.default_rng(seed).choice(len(rows), size=max_samples, replace=False)
    return [rows[i] for i in picked]


class RLHFDataset(torch.utils.data.Dataset):
    def __init__(self, files, tokenizer, data_config=None, tools: list[dict] | None = None, max_samples: int = -1):
        """`max_samples`: at most this many rows of the files, chosen by `select_rows` with the config's shuffle
        and seed (before overlong prompts are filtered; `num_rows_read` counts the files' rows)."""
        self.tokenizer = tokenizer
        self.tools = tools
        self.prompt_key = _cfg(data_config, "prompt_key", "prompt")
        self.max_prompt_length = int(_cfg(data_config, "max_prompt_length", 1024))
        self.filter_overlong_prompts = bool(_cfg(data_config, "filter_overlong_prompts", True))
        self.truncation = _cfg(data_config, "truncation", "error")
        self.return_raw_chat = bool(_cfg(data_config, "return_raw_chat", False))
        # verl's data.apply_chat_template_kwargs (e.g. enable_thinking, chat_template): every prompt render passes them
        self.template_kwargs = dict(_cfg(data_config, "apply_chat_template_kwargs", {}) or {})
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r}: must be one of {TRUNCATION_MODES}")
        if self.max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length={self.max_prompt_length}: must be > 0")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError("tokenizer has neither a pad_token_id nor an eos_token_id to pad prompts with")
        self.num_filtered = self.num_truncated = 0
        self.rows: list[dict] = []
        self.prompt_ids: list[list[int]] = []
        rows = read_rows(files, self.prompt_key, (_cfg(data_config, "image_key", "images"),
                                                  _cfg(data_config, "video_key", "videos")))
        self.num_rows_read = len(rows)
        rows = select_rows(rows, max_samples, bool(_cfg(data_config, "shuffle", True)), int(_cfg(data_config, "seed", 1)))
        if len(rows) < self.num_rows_read:
            log.warning("RLHFDataset: using %d of the files' %d rows (max_samples)", len(rows), self.num_rows_read)
        for row in rows:
            ids = self._tokenize(row)
            if len(ids) > self.max_prompt_length:
                if self.filter_overlong_prompts:
                    self.num_filtered += 1
                    continue
                ids = self._truncate(ids, row["_row"], row["_file"])
            row.setdefault("extra_info", None)
            self.rows.append(row)
            self.prompt_ids.append(ids)
        names = files if isinstance(files, (str, Path)) else ", ".join(map(str, files))
        if self.num_filtered:
            log.warning("RLHFDataset %s: filtered %d prompts longer than data.max_prompt_length=%d (kept %d)",
                        names, self.num_filtered, self.max_prompt_length, len(self.rows))
        if self.num_truncated:
            log.warning("RLHFDataset %s: truncated %d prompts longer than data.max_prompt_length=%d "
                        "(data.truncation=%s)", names, self.num_truncated, self.max_prompt_length, self.truncation)

    def _tokenize(self, row: dict) -> list[int]:
        """The prompt's token ids; a ValueError naming the file, row and column for a prompt that cannot be
        rendered (no messages, a message without string role and content, a template error)."""
        where = f"{row['_file']}: row {row['_row']}, column {self.prompt_key!r}"
        messages = row[self.prompt_key]
        if not messages:
            raise ValueError(f"{where}: the prompt holds no messages; each needs at least one {{role, content}}")
        bad = [j for j, m in enumerate(messages) if not (isinstance(m, dict) and isinstance(m.get("role"), str) and (
            isinstance(m.get("content"), str) or (m.get("content") is None and m.get("tool_calls"))))]
        if bad:
            raise ValueError(f"{where}: message {bad[0]} is {messages[bad[0]]!r}; each message needs a string "
                             "'role' and a string 'content' (null only beside 'tool_calls')")
        # every field the message has, as verl passes them; arrow's nulls for fields a message lacks left out
        messages = [{k: v for k, v in m.items() if v is not None or k == "content"} for m in messages]
        tools = {"tools": self.tools} if self.tools else {}
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **self.template_kwargs, **tools)
        except Exception as e:  # the template's own message says what it wanted; the location is ours
            hint = ("; the tokenizer has no chat template: set actor_rollout_ref.model.custom_chat_template (a "
                    "Jinja file or string) or data.apply_chat_template_kwargs.chat_template"
                    if getattr(self.tokenizer, "chat_template", None) is None
                    and "chat_template" not in self.template_kwargs else "")
            raise ValueError(f"{where}: the chat template cannot render this prompt ({type(e).__name__}: {e}){hint}") from e
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _truncate(self, ids: list[int], i: int, path: str) -> list[int]:
        if self.truncation == "error":
            raise ValueError(f"{path}: row {i} prompt has {len(ids)} tokens > data.max_prompt_length="
                             f"{self.max_prompt_length}; set data.filter_overlong_prompts=true or "
                             "data.truncation=left|right|middle")
        self.num_truncated += 1
        if self.truncation == "middle":   # verl's: the first half and the last half of the budget
            head = self.max_prompt_length // 2
            return ids[:head] + ids[-(self.max_prompt_length - head):]
        return ids[-self.max_prompt_length:] if self.truncation == "left" else ids[:self.max_prompt_length]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: int) -> dict:
        row, ids = self.rows[idx], self.prompt_ids[idx]
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
        position_ids = (attention_mask.cumsum(0) - 1).clamp(min=0)
        extra_info = row["extra_info"] or {}
        out = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
               "raw_prompt_ids": list(ids), "data_source": row["data_source"], "reward_model": row["reward_model"],
               "extra_info": extra_info, "ability": row.get("ability") or "",
               "interaction_kwargs": (extra_info.get("interaction_kwargs") or {}) if isinstance(extra_info, dict) else {},
               "index": extra_info.get("index", idx) if isinstance(extra_info, dict) else idx}
        if self.return_raw_chat:
            out["raw_prompt"] = row[self.prompt_key]
        for key, value in row.items():   # the files' other columns, as verl's dataset passes them on
            if key not in out and key != self.prompt_key and not key.startswith("_"):
                out[key] = value
        return out


def dataset_metrics(dataset: RLHFDataset) -> dict[str, float]:
    """What loading did to the prompts: dropped as overlong, or cut to data.max_prompt_length."""
    return {"data/filtered_prompts": float(dataset.num_filtered), "data/truncated_prompts": float(dataset.num_truncated),
            "data/prompts": float(len(dataset))}


def collate_fn(rows: list[dict]) -> DataProto:
    return collate_rows(rows)
