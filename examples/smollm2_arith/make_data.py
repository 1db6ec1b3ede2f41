"""Data for the SmolLM2 addition recipe: "What is a + b?" with a, b drawn from [low, high] (default 1..60).

    python examples/smollm2_arith/make_data.py --out DIR [--train 3000] [--test 200] [--seed 0] [--low 1] [--high 60]

verl-schema train/test parquet files written by hybridrl's task machinery (hybridrl/data/tasks/base.py): the
same seed gives the same files, and no question is in both splits. The prompt is the bare question — the
instruct model answers in its own words and reward.py scores the last integer — so `answer` (the SFT-style
reference) is just "a + b = c".
"""

from __future__ import annotations

import argparse
import random

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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--low", type=int, default=1)
    p.add_argument("--high", type=int, default=60)
    args = p.parse_args(argv)
    paths = write_task(TASK, args.out, args.train, args.test, args.seed, {"low": args.low, "high": args.high})
    for split, path in paths.items():
        print(f"wrote {split}: {path}")


if __name__ == "__main__":
    main()
