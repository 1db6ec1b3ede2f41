"""StatefulDataLoader: DataProto batches with an exact, resumable position.

Choices: the order of epoch e is a permutation drawn from `torch.Generator().manual_seed(seed + e)`, so the state
is just (epoch, samples consumed) — tiny, and a resumed loader yields exactly the batches the original would
have. The position advances when a batch is handed out, so a checkpoint taken right after step k resumes at
batch k+1. The batch size may change on resume (verl resumes then too): the order does not depend on it, so the
loader goes on at the same sample, in batches of the new size. `drop_last=True` drops the partial tail each epoch;
how many rows that is stays visible in `num_dropped_per_epoch`. A `for` loop covers the rest of the current epoch;
an exhausted epoch rolls over to the next one at the start of the following `for`.
"""

from __future__ import annotations

import torch

from hybridrl.protocol import collate_rows

__all__ = ["StatefulDataLoader"]


class StatefulDataLoader:
    def __init__(self, dataset, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                 collate=collate_rows, batch_size_key: str = "data.train_batch_size"):
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"{batch_size_key}={batch_size!r}: must be a positive integer")
        if drop_last and len(dataset) < batch_size:
            raise ValueError(f"{batch_size_key}={batch_size} is larger than the dataset ({len(dataset)} rows "
                             "after filtering): no full batch can be formed")
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.drop_last, self.collate = drop_last, collate
        self.epoch = self.sample_index = 0
        self.num_dropped_per_epoch = len(dataset) % batch_size if drop_last else 0

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        return torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    @property
    def batch_index(self) -> int:
        """Batches of the current size handed out this epoch."""
        return -(-self.sample_index // self.batch_size)

    def _has_batch(self) -> bool:
        left = len(self.dataset) - self.sample_index
        return left >= self.batch_size or (not self.drop_last and left > 0)

    def __iter__(self):
        if not self._has_batch():
            self.epoch, self.sample_index = self.epoch + 1, 0
        order = self._order(self.epoch)
        while self._has_batch():
            idx = order[self.sample_index:self.sample_index + self.batch_size]
            self.sample_index += len(idx)
            yield self.collate([self.dataset[i] for i in idx])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "sample_index": self.sample_index, "batch_index": self.batch_index,
                "seed": self.seed, "shuffle": self.shuffle, "batch_size": self.batch_size,
                "dataset_len": len(self.dataset)}

    def load_state_dict(self, state: dict) -> None:
        """The saved position; a saved batch size other than this loader's continues at the same sample."""
        for key in ("seed", "shuffle", "dataset_len"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise ValueError(f"dataloader state: {key}={state[key]!r} in the checkpoint but {mine!r} now; "
                                 "resuming would not replay the same data order")
        saved_size = int(state.get("batch_size", self.batch_size))
        self.epoch = int(state["epoch"])
        self.sample_index = int(state.get("sample_index", int(state["batch_index"]) * saved_size))
