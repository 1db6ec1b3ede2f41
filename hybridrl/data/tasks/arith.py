"""`arith`: integer arithmetic with usual precedence, e.g. "Compute 37 + 12 * 5."

Knobs: `digits` (each operand has exactly this many digits), `operands` (count), `ops` (subset of "+-*/"),
`unmarked` (the fraction of worked solutions that stop after the working, without the `#### N` line: imperfect
demonstrations that the strict scorer gives 0 — the embedded demo's SFT learns both styles and GRPO the one that
pays; 0 by default, and then no extra random draw, so existing seeds give the same files).
Division only appears when every intermediate result stays an integer (drawn by rejection), so the worked
solution — one operator reduced per step, `*`/`/` before `+`/`-`, left to right — is integer all the way and
ends in `#### N`, the form `hybridrl.rewards.arith` scores.
"""

from __future__ import annotations

import random

import pyarrow as pa

from hybridrl.data.tasks.base import Example, Task

INSTRUCTION = "Show the intermediate steps, then give the final answer on its own line as #### <number>."
MAX_TRIES = 1000


def _validate(knobs: dict) -> None:
    for key, low in (("digits", 1), ("operands", 2)):
        if not isinstance(knobs[key], int) or knobs[key] < low:
            raise ValueError(f"arith knob {key!r} must be an integer >= {low}, got {knobs[key]!r}")
    if not isinstance(knobs["unmarked"], (int, float)) or not 0 <= knobs["unmarked"] <= 1:
        raise ValueError(f"arith knob 'unmarked' must be a fraction in [0, 1], got {knobs['unmarked']!r}")
    ops = knobs["ops"]
    if not isinstance(ops, str) or not ops or set(ops) - set("+-*/"):
        raise ValueError(f"arith knob 'ops' must be a non-empty subset of '+-*/', got {ops!r}")


def _reduce_steps(tokens: list) -> list[list] | None:
    """Successive token lists, one operator applied per step; None if a step is not an integer."""
    steps = [tokens]
    while len(tokens) > 1:
        ops = tokens[1::2]
        pos = next((i for i, op in enumerate(ops) if op in "*/"), 0) * 2 + 1
        a, op, b = tokens[pos - 1], tokens[pos], tokens[pos + 1]
        if op == "/" and (b == 0 or a % b):
            return None
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
        tokens = tokens[:pos - 1] + [value] + tokens[pos + 2:]
        steps.append(tokens)
    return steps


def _show(tokens: list) -> str:
    return " ".join(str(t) for t in tokens)


def make_example(rng: random.Random, knobs: dict) -> Example:
    low, high = 10 ** (knobs["digits"] - 1), 10 ** knobs["digits"] - 1
    for _ in range(MAX_TRIES):
        tokens: list = [rng.randint(low, high)]
        for _ in range(knobs["operands"] - 1):
            tokens += [rng.choice(knobs["ops"]), rng.randint(low, high)]
        steps = _reduce_steps(tokens)
        if steps is not None:
            break
    else:
        raise ValueError(f"arith knobs {knobs}: no integer-valued expression in {MAX_TRIES} draws")
    expr, answer = _show(tokens), steps[-1][0]
    work = " = ".join(_show(s) for s in steps)
    unmarked = knobs["unmarked"] > 0 and rng.random() < knobs["unmarked"]
    return Example(question=f"Compute {expr}.", prompt=f"Compute {expr}. {INSTRUCTION}",
                   solution=work if unmarked else f"{work}\n#### {answer}", ground_truth=str(answer), extra={"expression": expr})


TASK = Task(name="arith", data_source="arith", ability="math", extra_fields=[("expression", pa.string())],
            make_example=make_example, defaults={"digits": 2, "operands": 2, "ops": "+-*", "unmarked": 0.0}, validate=_validate)
