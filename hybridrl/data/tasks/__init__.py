"""Built-in synthetic tasks, each writing verl-schema train/test parquet files (see base.py)."""

from hybridrl.data.tasks import arith, bignum, countdown, gsm8k_synthetic
from hybridrl.data.tasks.base import Example, Task, write_task

TASKS: dict[str, Task] = {t.name: t for t in (arith.TASK, bignum.TASK, countdown.TASK, gsm8k_synthetic.TASK)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available: {sorted(TASKS)}")
    return TASKS[name]


def make_task(name: str, out_dir, num_train: int, num_test: int, seed: int = 0, **knobs):
    """Generate task `name` into out_dir/{train,test}.parquet; returns {'train': path, 'test': path}."""
    return write_task(get_task(name), out_dir, num_train, num_test, seed, knobs)


def make_dataset(task: str, out_dir, n_train: int, n_test: int, seed: int = 0, **knobs):
    """Alias of make_task with the argument names the demo uses."""
    return make_task(task, out_dir, n_train, n_test, seed, **knobs)


__all__ = ["TASKS", "Example", "Task", "get_task", "make_dataset", "make_task", "write_task"]
