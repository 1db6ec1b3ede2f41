"""What every task generator shares: the verl row schema and the deterministic split writer.

Choices:
- Rows follow verl's examples/data_preprocess layout (data_source, prompt as chat messages, ability,
  reward_model{style, ground_truth}, extra_info{split, index, ...}) plus a top-level `answer` column holding the
  full solution text, usable as the SFT target; the solution always ends in the form the scorer accepts.
- One `random.Random(seed)` stream draws train then test, and every question is unique across both splits (no
  train/test leakage). A knob setting too small to give that many unique questions is a ValueError, not a
  silent duplicate.
- The arrow schema is spelled out, so types never depend on the first row and the same seed gives
  byte-identical parquet files.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["Example", "Task", "write_task"]

PROMPT_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
MAX_ATTEMPTS_PER_ROW = 200


@dataclass(frozen=True)
class Example:
    question: str        # raw question, without the answer-format instruction
    prompt: str          # what the user message says (question + format instruction)
    solution: str        # full worked solution ending in the scorer's answer format
    ground_truth: str
    extra: dict          # task-specific extra_info fields (besides split and index)


@dataclass(frozen=True)
class Task:
    name: str
    data_source: str
    ability: str
    extra_fields: list[tuple[str, pa.DataType]]
    make_example: Callable[[random.Random, dict], Example]
    defaults: dict
    validate: Callable[[dict], None]
    system_prompt: str | None = None  # a system message before every user prompt

    def knobs(self, overrides: dict | None) -> dict:
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        unknown = sorted(set(overrides) - set(self.defaults))
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown knob(s) {unknown}; known: {sorted(self.defaults)}")
        knobs = {**self.defaults, **overrides}
        self.validate(knobs)
        return knobs

    def schema(self) -> pa.Schema:
        extra = pa.struct([("split", pa.string()), ("index", pa.int64()), *self.extra_fields])
        return pa.schema([("data_source", pa.string()), ("prompt", PROMPT_TYPE), ("ability", pa.string()),
                          ("reward_model", REWARD_MODEL_TYPE), ("extra_info", extra), ("answer", pa.string())])

    def row(self, ex: Example, split: str, index: int) -> dict:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return {"data_source": self.data_source, "prompt": [*system, {"role": "user", "content": ex.prompt}],
                "ability": self.ability, "reward_model": {"style": "rule", "ground_truth": ex.ground_truth},
                "extra_info": {"split": split, "index": index, **ex.extra}, "answer": ex.solution}

    def generate(self, num_train: int, num_test: int, seed: int, knobs: dict | None = None) -> dict[str, list[dict]]:
        """{'train': rows, 'test': rows}, unique questions across both splits."""
        for key, n in (("train", num_train), ("test", num_test)):
            if not isinstance(n, int) or n < 0:
                raise ValueError(f"task {self.name!r}: --{key} must be an integer >= 0, got {n!r}")
        knobs = self.knobs(knobs)
        rng, seen = random.Random(seed), set()
        out: dict[str, list[dict]] = {}
        for split, n in (("train", num_train), ("test", num_test)):
            rows, attempts = [], 0
            while len(rows) < n:
                attempts += 1
                if attempts > MAX_ATTEMPTS_PER_ROW * max(n, 1):
                    raise ValueError(f"task {self.name!r} with knobs {knobs}: found only {len(seen)} unique questions "
                                     f"in {attempts} draws, {num_train + num_test} requested; widen the knobs")
                ex = self.make_example(rng, knobs)
                if ex.question in seen:
                    continue
                seen.add(ex.question)
                rows.append(self.row(ex, split, len(rows)))
            out[split] = rows
        return out


def write_task(task: Task, out_dir: str | Path, num_train: int, num_test: int, seed: int,
               knobs: dict | None = None) -> dict[str, Path]:
    """Write out_dir/train.parquet and out_dir/test.parquet; returns their paths."""
    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in task.generate(num_train, num_test, seed, knobs).items():
        path = out_dir / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=task.schema()), path)
        paths[split] = path
    return paths
