"""StatefulDataLoader: DataProto batches with an exact, resumable position.

Choices: the order of epoch e is a permutation drawn from `torch.Generator().manual_seed(seed + e)`, so the state
is just (epoch, batches consumed) — tiny, and a resumed loader yields exactly the batches the original would
have. The position advances when a batch is handed out, so a checkpoint taken right after step k resumes at
batch k+1. `drop_last=True` drops the partial tail each epoch; how many rows that is stays visible in
`num_dropped_per_epoch`. A `for` loop covers the rest of the current epoch; an exhausted epoch rolls over to the
next one at the start of the following `for`.
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
        self.epoch = self.batch_index = 0
        self.num_dropped_per_epoch = len(dataset) % batch_size if drop_last else 0

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        return torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def __iter__(self):
        if self.batch_index >= len(self):
            self.epoch, self.batch_index = self.epoch + 1, 0
        order = self._order(self.epoch)
        while self.batch_index < len(self):
            start = self.batch_index * self.batch_size
            idx = order[start:start + self.batch_size]
            self.batch_index += 1
            yield self.collate([self.dataset[i] for i in idx])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_index": self.batch_index, "seed": self.seed, "shuffle": self.shuffle,
                "batch_size": self.batch_size, "dataset_len": len(self.dataset)}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "shuffle", "batch_size", "dataset_len"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise ValueError(f"dataloader state: {key}={state[key]!r} in the checkpoint but {mine!r} now; "
                                 "resuming would not replay the same batches")
        self.epoch, self.batch_index = int(state["epoch"]), int(state["batch_index"])
