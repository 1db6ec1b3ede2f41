"""Data: verl-schema parquet datasets, synthetic task generators, chat-template tokenization, resumable loader."""

from hybridrl.data.dataloader import StatefulDataLoader
from hybridrl.data.rl_dataset import RLHFDataset, collate_fn, read_rows
from hybridrl.data.tasks import TASKS, make_task

__all__ = ["TASKS", "RLHFDataset", "StatefulDataLoader", "collate_fn", "make_task", "read_rows"]
