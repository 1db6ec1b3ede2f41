"""Samples written to disk as verl writes them (`trainer.rollout_data_dir`, `trainer.validation_data_dir`): one JSON
line per sample in `{dir}/{step}.jsonl` with its decoded prompt (`input`) and response (`output`), ground truth
(`gts`), reward (`score`: the token-level reward summed, the overlong penalty included) and `step`, then each
per-sample field the caller adds (`uid`, the scorer's extra info); as in verl, an extra field of the scorer's named
like a base one (e.g. its own `score`, without the penalty) takes that column.

Choices:
- The file is written whole to a temporary name and renamed into place, so a crash leaves the previous dump or none,
  never half a file; a later dump of the same step (a resumed run) replaces it.
- Values are made JSON-native (numpy scalars and arrays, tensors); a field whose length is not the sample count is
  refused, naming it, rather than misaligned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hybridrl.trainer.tracking import to_python

__all__ = ["dump_generations"]


def _native(value: Any) -> Any:
    """tracking.to_python through dicts and lists (a ground truth may be either)."""
    if isinstance(value, dict):
        return {str(k): _native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_native(v) for v in value]
    return to_python(value)


def dump_generations(directory: str | os.PathLike, step: int, inputs: list[str], outputs: list[str], gts: list,
                     scores: list[float], fields: dict[str, list] | None = None) -> Path:
    """Write `{directory}/{step}.jsonl`: one line per sample (input, output, gts, score, step, then `fields`)."""
    n = len(inputs)
    columns = {"input": inputs, "output": outputs, "gts": gts, "score": scores, "step": [int(step)] * n,
               **(fields or {})}
    for name, values in columns.items():
        if len(values) != n:
            raise ValueError(f"dump_generations: '{name}' has {len(values)} values for {n} samples")
    path = Path(directory).expanduser() / f"{int(step)}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(n):
            row = {name: _native(values[i]) for name, values in columns.items()}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
