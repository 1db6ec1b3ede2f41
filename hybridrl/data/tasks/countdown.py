"""`countdown`: reach a target from given numbers with + - * /, each number used exactly once.

Solvable by construction: the generator combines the numbers pairwise at random (subtraction only when it stays
>= 0, division only when exact) until one value is left; that value is the target and the combination is the
reference solution. Draws whose target falls outside [1, max_target] are redrawn. The ground truth is a JSON
string {"numbers": [...], "target": t} (our schema keeps ground_truth a string; the scorer also accepts
TinyZero's dict form). The answer goes inside <answer> </answer>, as in TinyZero's countdown.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa

from hybridrl.data.tasks.base import Example, Task

MAX_TRIES = 1000


def _validate(knobs: dict) -> None:
    for key, low in (("num_numbers", 2), ("max_number", 1), ("max_target", 1)):
        if not isinstance(knobs[key], int) or knobs[key] < low:
            raise ValueError(f"countdown knob {key!r} must be an integer >= {low}, got {knobs[key]!r}")
    if knobs["num_numbers"] > 8:
        raise ValueError(f"countdown knob 'num_numbers' must be <= 8, got {knobs['num_numbers']}")


def _combine(rng: random.Random, numbers: list[int]) -> tuple[int, str, list[str]]:
    pool = [(n, str(n)) for n in numbers]
    steps = []
    while len(pool) > 1:
        (a, ea), (b, eb) = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
        if a < b:
            (a, ea), (b, eb) = (b, eb), (a, ea)
        choices = ["+", "*", "-"] + (["/"] if b and a % b == 0 else [])
        op = rng.choice(choices)
        value = {"+": a + b, "*": a * b, "-": a - b, "/": a // b if b else 0}[op]
        steps.append(f"{a} {op} {b} = {value}")
        pool.append((value, f"({ea} {op} {eb})"))
    value, expr = pool[0]
    return value, expr[1:-1] if expr.startswith("(") else expr, steps


def make_example(rng: random.Random, knobs: dict) -> Example:
    for _ in range(MAX_TRIES):
        numbers = [rng.randint(1, knobs["max_number"]) for _ in range(knobs["num_numbers"])]
        target, expr, steps = _combine(rng, list(numbers))
        if 1 <= target <= knobs["max_target"]:
            break
    else:
        raise ValueError(f"countdown knobs {knobs}: no target within [1, max_target] in {MAX_TRIES} draws")
    question = f"Using the numbers {numbers}, create an equation that equals {target}."
    prompt = (f"{question} You can use basic arithmetic operations (+, -, *, /) and each number must be used "
              "exactly once. Show your work, then give the final equation inside <answer> </answer> tags, "
              "for example <answer>(1 + 2) / 3</answer>.")
    solution = "\n".join(steps) + f"\n<answer>{expr}</answer>"
    gt = json.dumps({"numbers": numbers, "target": target}, sort_keys=True)
    return Example(question=question, prompt=prompt, solution=solution, ground_truth=gt,
                   extra={"numbers": numbers, "target": target})


TASK = Task(name="countdown", data_source="countdown", ability="math",
            extra_fields=[("numbers", pa.list_(pa.int64())), ("target", pa.int64())],
            make_example=make_example, defaults={"num_numbers": 4, "max_number": 99, "max_target": 100},
            validate=_validate)
