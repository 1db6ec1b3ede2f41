"""`bignum`: products of big integers, e.g. "Compute 73928104 * 5518203377." — a task that needs a tool.

Operands have `min_digits`..`max_digits` digits (default 8..12; each operand's length drawn uniformly, then its
digits), `operands` of them (default 2), so a product has 16-24 digits: a model cannot multiply that in its head,
and calling the calculator (offered in the system message through the chat template's `tools=`, see
`actor_rollout_ref.rollout.multi_turn`) is the practical way to be right. The worked solution shows the call and
ends in `#### N`; the scorer (`hybridrl.rewards.bignum`) pays only the exact integer.
"""

from __future__ import annotations

import json
import math
import random

import pyarrow as pa

from hybridrl.data.tasks.base import Example, Task

SYSTEM = "You are a helpful assistant. Use the calculator tool for arithmetic: do not multiply big numbers in your head."
INSTRUCTION = "Give the final answer on its own line as #### <number>."


def _validate(knobs: dict) -> None:
    for key, low in (("min_digits", 1), ("max_digits", 1), ("operands", 2)):
        if isinstance(knobs[key], bool) or not isinstance(knobs[key], int) or knobs[key] < low:
            raise ValueError(f"bignum knob {key!r} must be an integer >= {low}, got {knobs[key]!r}")
    if knobs["min_digits"] > knobs["max_digits"]:
        raise ValueError(f"bignum knobs: min_digits={knobs['min_digits']} must be <= max_digits={knobs['max_digits']}")


def make_example(rng: random.Random, knobs: dict) -> Example:
    numbers = []
    for _ in range(knobs["operands"]):
        digits = rng.randint(knobs["min_digits"], knobs["max_digits"])
        numbers.append(rng.randint(10 ** (digits - 1), 10 ** digits - 1))
    expr = " * ".join(map(str, numbers))
    answer = math.prod(numbers)
    call = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
    return Example(question=f"Compute {expr}.", prompt=f"Compute {expr}. {INSTRUCTION}",
                   solution=f"<tool_call>\n{call}\n</tool_call>\n#### {answer}", ground_truth=str(answer),
                   extra={"expression": expr})


TASK = Task(name="bignum", data_source="bignum", ability="math", extra_fields=[("expression", pa.string())],
            make_example=make_example, defaults={"min_digits": 8, "max_digits": 12, "operands": 2},
            validate=_validate, system_prompt=SYSTEM)
