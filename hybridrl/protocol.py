"""DataProto: the one container that flows between the driver and the workers.

Shaped like verl's DataProto so its users feel at home:
  batch          dict[str, Tensor], every tensor sharing the leading batch dimension
  non_tensor     dict[str, np.ndarray of dtype object], same leading length (strings, dicts, ...)
  meta_info      dict of scalars / small objects that travel with the batch (not split)

Choices: a plain dict of tensors instead of tensordict (tensordict's wheels do not match both the CPU
torch here and torch 2.11 on the GPU machine, and we need only a handful of operations). Every
operation checks the batch dimension and names the offending key, because a silent length mismatch
in RL data is a wrong gradient, not a crash.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["DataProto", "pad_dataproto_to_divisor", "unpad_dataproto"]


def _as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


@dataclass
class DataProto:
    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.non_tensor_batch = {k: _as_object_array(v) for k, v in self.non_tensor_batch.items()}
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, tensors=None, non_tensors=None, meta_info=None) -> DataProto:
        return cls(dict(tensors or {}), dict(non_tensors or {}), dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info=None) -> DataProto:
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        others = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, others, meta_info)

    def check_consistency(self):
        sizes = {k: v.shape[0] for k, v in self.batch.items()}
        sizes.update({k: len(v) for k, v in self.non_tensor_batch.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"DataProto: all entries must share the batch dimension, got sizes {sizes}")

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        for v in self.batch.values():
            return v.shape[0]
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0

    def keys(self) -> list[str]:
        return list(self.batch) + list(self.non_tensor_batch)

    def __contains__(self, key: str) -> bool:
        return key in self.batch or key in self.non_tensor_batch

    def __getitem__(self, item):
        if isinstance(item, str):
            if item in self.batch:
                return self.batch[item]
            if item in self.non_tensor_batch:
                return self.non_tensor_batch[item]
            raise KeyError(f"DataProto has no key {item!r}; keys: {self.keys()}")
        if isinstance(item, int):
            item = slice(item, item + 1) if item != -1 else slice(item, None)
        return self._index(item)

    def _index(self, idx) -> DataProto:
        if isinstance(idx, torch.Tensor):
            idx_np = idx.cpu().numpy()
        else:
            idx_np = idx
        if isinstance(idx, slice):
            batch = {k: v[idx] for k, v in self.batch.items()}
        else:
            t = torch.as_tensor(np.asarray(idx_np))
            batch = {k: v[t.to(v.device)] for k, v in self.batch.items()}
        non_tensor = {k: v[idx_np] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch, non_tensor, dict(self.meta_info))

    def slice(self, start: int, end: int) -> DataProto:
        return self._index(slice(start, end))

    def select_idxs(self, idxs) -> DataProto:
        return self._index(idxs)

    def select(self, batch_keys: Sequence[str] | None = None, non_tensor_batch_keys: Sequence[str] | None = None,
               meta_info_keys: Sequence[str] | None = None, deepcopy: bool = False) -> DataProto:
        def pick(d, keys, what):
            if keys is None:
                return dict(d)
            missing = [k for k in keys if k not in d]
            if missing:
                raise KeyError(f"DataProto.select: {what} keys {missing} not present; have {list(d)}")
            return {k: d[k] for k in keys}

        out = DataProto(pick(self.batch, batch_keys, "batch"),
                        pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch"),
                        pick(self.meta_info, meta_info_keys, "meta_info"))
        return copy.deepcopy(out) if deepcopy else out

    def pop(self, batch_keys: Sequence[str] = (), non_tensor_batch_keys: Sequence[str] = (),
            meta_info_keys: Sequence[str] = ()) -> DataProto:
        for keys, d, what in ((batch_keys, self.batch, "batch"),
                              (non_tensor_batch_keys, self.non_tensor_batch, "non_tensor_batch"),
                              (meta_info_keys, self.meta_info, "meta_info")):
            missing = [k for k in keys if k not in d]
            if missing:
                raise KeyError(f"DataProto.pop: {what} keys {missing} not present; have {list(d)}")
        return DataProto({k: self.batch.pop(k) for k in batch_keys},
                         {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys},
                         {k: self.meta_info.pop(k) for k in meta_info_keys})

    def rename(self, old_keys: Sequence[str], new_keys: Sequence[str]) -> DataProto:
        for o, n in zip(old_keys, new_keys, strict=True):
            self.batch[n] = self.batch.pop(o)
        return self

    # ------------------------------------------------------------------ combination
    def union(self, other: DataProto) -> DataProto:
        """Merge other's keys into self (in place, returns self). A shared key must hold equal data."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"DataProto.union: batch sizes differ ({len(self)} vs {len(other)})")
        for k, v in other.batch.items():
            if k in self.batch and (self.batch[k].shape != v.shape or not torch.equal(self.batch[k], v.to(self.batch[k].device))):
                raise ValueError(f"DataProto.union: key {k!r} present in both with different values")
            self.batch[k] = v
        for k, v in other.non_tensor_batch.items():
            if k in self.non_tensor_batch and not np.array_equal(self.non_tensor_batch[k], v):
                raise ValueError(f"DataProto.union: non-tensor key {k!r} present in both with different values")
            self.non_tensor_batch[k] = v
        for k, v in other.meta_info.items():
            if k in self.meta_info and not _meta_equal(self.meta_info[k], v):
                raise ValueError(f"DataProto.union: meta_info key {k!r} differs ({self.meta_info[k]!r} vs {v!r})")
            self.meta_info[k] = v
        self.check_consistency()  # an empty `other` with keys would otherwise leave 0-row entries behind
        return self

    @staticmethod
    def concat(items: Sequence[DataProto]) -> DataProto:
        """Concatenate along the batch dim. meta_info: equal keys kept; 'metrics' dicts are merged into
        lists (one entry per worker/chunk) so per-worker metrics survive the collect."""
        items = [d for d in items if d is not None]
        if not items:
            raise ValueError("DataProto.concat: nothing to concatenate")
        keys = set(items[0].batch)
        nkeys = set(items[0].non_tensor_batch)
        for i, d in enumerate(items):
            if set(d.batch) != keys or set(d.non_tensor_batch) != nkeys:
                raise ValueError(f"DataProto.concat: item {i} has keys {d.keys()}, item 0 has {items[0].keys()}")
        batch = {k: _cat_key(k, [d.batch[k] for d in items]) for k in items[0].batch}
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in items]) for k in items[0].non_tensor_batch}
        meta: dict[str, Any] = {}
        for d in items:
            for k, v in d.meta_info.items():
                if k == "metrics":
                    merged = meta.setdefault("metrics", {})
                    for mk, mv in v.items():
                        merged.setdefault(mk, []).extend(mv if isinstance(mv, list) else [mv])
                elif k not in meta:
                    meta[k] = v
        return DataProto(batch, non_tensor, meta)

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into `chunks` equal parts; len(self) must be divisible (pad first with pad_dataproto_to_divisor)."""
        n = len(self)
        if chunks <= 0 or n % chunks:
            raise ValueError(f"DataProto.chunk: batch size {n} is not divisible by chunks={chunks}; "
                             "pad with pad_dataproto_to_divisor first")
        step = n // chunks
        return [self.slice(i * step, (i + 1) * step) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of at most split_size rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"DataProto.split: split_size must be > 0, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """interleave=True: a a b b (the n samples of a prompt are adjacent, as GRPO groups expect)."""
        n = len(self)
        if interleave:
            idx = torch.arange(n).repeat_interleave(repeat_times)
        else:
            idx = torch.arange(n).repeat(repeat_times)
        return self._index(idx)

    def reorder(self, indices: torch.Tensor) -> None:
        out = self._index(indices)
        self.batch, self.non_tensor_batch = out.batch, out.non_tensor_batch

    # ------------------------------------------------------------------ devices, io
    def to(self, device) -> DataProto:
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        return self

    def cpu(self) -> DataProto:
        return self.to("cpu")

    def save_to_disk(self, path: str | Path) -> None:
        with open(path, "wb") as f:
            pickle.dump(self.to_state(), f)

    @classmethod
    def load_from_disk(cls, path: str | Path) -> DataProto:
        with open(path, "rb") as f:
            return cls.from_state(pickle.load(f))

    def to_state(self) -> dict:
        return {"batch": {k: v.cpu() for k, v in self.batch.items()},
                "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    @classmethod
    def from_state(cls, state: dict) -> DataProto:
        return cls(state["batch"], state["non_tensor_batch"], state["meta_info"])

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.batch.items()}
        return f"DataProto(len={len(self)}, batch={shapes}, non_tensor={list(self.non_tensor_batch)}, meta={list(self.meta_info)})"


def _cat_key(key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    if len({t.shape[1:] for t in tensors}) > 1:
        raise ValueError(f"DataProto.concat: key {key!r} has different trailing shapes {[tuple(t.shape) for t in tensors]}")
    return torch.cat(tensors, dim=0)


def _meta_equal(a, b) -> bool:
    try:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return bool(np.array_equal(a, b))
        return bool(a == b)
    except Exception:
        return False


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad by repeating rows from the start so len is divisible by size_divisor. Returns (padded, pad_size)."""
    n = len(data)
    pad = (-n) % size_divisor
    if pad == 0:
        return data, 0
    if n == 0:
        raise ValueError("pad_dataproto_to_divisor: cannot pad an empty DataProto")
    idx = torch.arange(pad) % n
    return DataProto.concat([data, data._index(idx)]), pad


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    return data if pad_size == 0 else data.slice(0, len(data) - pad_size)


def collate_rows(rows: Iterable[dict]) -> DataProto:
    """Stack a list of per-sample dicts (tensors stacked, everything else into object arrays)."""
    rows = list(rows)
    if not rows:
        raise ValueError("collate_rows: empty list")
    tensors = {k: torch.stack([r[k] for r in rows]) for k, v in rows[0].items() if isinstance(v, torch.Tensor)}
    # non-tensor entries: every row's keys (rows of files with different columns hold None where theirs lack one)
    keys = dict.fromkeys(k for r in rows for k, v in r.items() if not isinstance(v, torch.Tensor))
    others = {k: _as_object_array([r.get(k) for r in rows]) for k in keys}
    return DataProto(tensors, others)
