"""`hybridrl data make TASK --out DIR --train N --test M --seed S [knobs]` and `hybridrl data convert SRC --out FILE
...` (convert.py: your JSONL / CSV / datasets / parquet into the trainer's schema).

`register(subparsers)` adds the `data` command to the top-level parser; each task is a sub-command with its own
knob flags (so `--help` lists them); leaf parsers set `func(args)` (returns the exit code, 0) for the top-level CLI to call.
"""

from __future__ import annotations

import argparse

from hybridrl.data.tasks import TASKS, make_task

__all__ = ["register", "run_make"]

KNOB_FLAGS = {
    "arith": [("--digits", int, "digits per operand"), ("--operands", int, "number of operands"),
              ("--ops", str, "operators to draw from, subset of '+-*/'"),
              ("--unmarked", float, "fraction of solutions without the '#### N' line")],
    "bignum": [("--min-digits", int, "fewest digits of an operand"), ("--max-digits", int, "most digits of an operand"),
               ("--operands", int, "numbers multiplied")],
    "countdown": [("--num-numbers", int, "numbers given"), ("--max-number", int, "largest given number"),
                  ("--max-target", int, "largest target")],
    "gsm8k-synthetic": [("--max-value", int, "bound on the numbers in the templates")],
}


def run_make(args: argparse.Namespace) -> int:
    knobs = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_"))
             for flag, _, _ in KNOB_FLAGS[args.task]}
    paths = make_task(args.task, args.out, args.train, args.test, args.seed, **knobs)
    for split, path in paths.items():
        print(f"wrote {split}: {path}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    from hybridrl.data.convert import register as register_convert

    data = subparsers.add_parser("data", help="generate a task's datasets, or convert yours")
    sub = data.add_subparsers(dest="data_command", required=True)
    register_convert(sub)
    make = sub.add_parser("make", help="write TASK's train.parquet / test.parquet (verl schema)")
    tasks = make.add_subparsers(dest="task", required=True)
    for name in TASKS:
        p = tasks.add_parser(name, help=f"the {name} task")
        p.add_argument("--out", required=True, help="output directory")
        p.add_argument("--train", type=int, default=1000, help="train rows")
        p.add_argument("--test", type=int, default=100, help="test rows")
        p.add_argument("--seed", type=int, default=0)
        for flag, typ, help_text in KNOB_FLAGS[name]:
            p.add_argument(flag, type=typ, default=None, help=f"{help_text} (default {TASKS[name].defaults[flag[2:].replace('-', '_')]})")
        p.set_defaults(func=run_make)
    return data
