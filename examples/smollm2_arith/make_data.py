"""Data for the SmolLM2 addition recipe: "What is a + b?" with a, b drawn from [low, high] (default 1..60).

    python examples/smollm2_arith/make_data.py --out DIR [--train 3000] [--test 200] [--seed 0] [--low 1] [--high 60]
        [--interaction NAME]

verl-schema train/test parquet files written by hybridrl's task machinery (hybridrl/data/tasks/base.py): the
same seed gives the same files, and no question is in both splits. The prompt is the bare question — the
instruct model answers in its own words and reward.py scores the last integer — so `answer` (the SFT-style
reference) is just "a + b = c". `--interaction NAME` (examples/smollm2_interaction) also writes
`extra_info.interaction_kwargs` = {"name": NAME, "ground_truth": "c"}, so each sample is answered by that
interaction of the multi-turn rollout; the questions are the same as without it (same seed, same rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import random

import pyarrow as pa

from hybridrl.data.tasks.base import Example, Task, write_task

DATA_SOURCE = "smollm2_add"


def _validate(knobs: dict) -> None:
    low, high = knobs["low"], knobs["high"]
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
        raise ValueError(f"knobs low={low!r}, high={high!r}: need integers with 0 <= low <= high")


def make_example(rng: random.Random, knobs: dict) -> Example:
    a, b = rng.randint(knobs["low"], knobs["high"]), rng.randint(knobs["low"], knobs["high"])
    question = f"What is {a} + {b}?"
    return Example(question=question, prompt=question, solution=f"{a} + {b} = {a + b}", ground_truth=str(a + b),
                   extra={})


TASK = Task(name="smollm2_add", data_source=DATA_SOURCE, ability="math", extra_fields=[],
            make_example=make_example, defaults={"low": 1, "high": 60}, validate=_validate)


INTERACTION_KWARGS = pa.struct([("name", pa.string()), ("ground_truth", pa.string())])


def with_interaction(name: str) -> Task:
    """TASK whose rows name the interaction `name` (extra_info.interaction_kwargs, verl's schema)."""
    if not name:
        raise ValueError(f"--interaction={name!r}: name the interaction of the interaction config")

    def make(rng: random.Random, knobs: dict) -> Example:
        ex = make_example(rng, knobs)
        return dataclasses.replace(ex, extra={"interaction_kwargs": {"name": name, "ground_truth": ex.ground_truth}})

    return dataclasses.replace(TASK, extra_fields=[("interaction_kwargs", INTERACTION_KWARGS)], make_example=make)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--low", type=int, default=1)
    p.add_argument("--high", type=int, default=60)
    p.add_argument("--interaction", default=None, help="name of the interaction each sample selects")
    args = p.parse_args(argv)
    task = TASK if args.interaction is None else with_interaction(args.interaction)
    paths = write_task(task, args.out, args.train, args.test, args.seed, {"low": args.low, "high": args.high})
    for split, path in paths.items():
        print(f"wrote {split}: {path}")


if __name__ == "__main__":
    main()
