"""`gsm8k-synthetic`: templated multi-step word problems in GSM8K's format.

Rows mirror verl's examples/data_preprocess/gsm8k.py exactly (data_source "openai/gsm8k", the same
"Let's think step by step..." instruction, extra_info with the raw question and answer), so the GSM8K scorer and
any verl GSM8K recipe run unchanged; solutions use GSM8K's `<<a*b=c>>` calculator notes and end in `#### N`.
Knob `max_value` bounds the numbers drawn. Every template's answer is a non-negative integer by construction.
"""

from __future__ import annotations

import random

import pyarrow as pa

from hybridrl.data.tasks.base import Example, Task

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Mark", "Carla", "Joy"]
ITEMS = ["apples", "pencils", "stickers", "cookies", "marbles", "books", "shells", "cards"]


def _sold_two_months(r, v):
    name, item, a = r.choice(NAMES), r.choice(ITEMS), r.randint(2, v) * 2
    b = a // 2
    q = f"{name} sold {item} to {a} of her friends in April, and then she sold half as many in May. " \
        f"How many {item} did {name} sell altogether in April and May?"
    s = [f"{name} sold {a}/2 = <<{a}/2={b}>>{b} {item} in May.",
         f"{name} sold {a}+{b} = <<{a}+{b}={a + b}>>{a + b} {item} altogether in April and May."]
    return q, s, a + b


def _hourly_pay(r, v):
    name, rate, hours = r.choice(NAMES), r.randint(2, v), r.randint(2, 12)
    pay = rate * hours
    q = f"{name} earns ${rate} an hour for babysitting. Yesterday, {name} did {hours} hours of babysitting. " \
        f"How much did {name} earn?"
    return q, [f"{name} earned {rate}*{hours} = <<{rate}*{hours}={pay}>>{pay} dollars."], pay


def _boxes_left(r, v):
    name, item = r.choice(NAMES), r.choice(ITEMS)
    boxes, per = r.randint(2, 9), r.randint(2, v)
    total = boxes * per
    given = r.randint(1, total - 1)
    left = total - given
    q = f"{name} has {boxes} boxes with {per} {item} in each box. {name} gives away {given} {item}. " \
        f"How many {item} does {name} have left?"
    s = [f"{name} has {boxes}*{per} = <<{boxes}*{per}={total}>>{total} {item}.",
         f"After giving some away, {name} has {total}-{given} = <<{total}-{given}={left}>>{left} {item} left."]
    return q, s, left


def _shared_equally(r, v):
    name, item, friends, each = r.choice(NAMES), r.choice(ITEMS), r.randint(2, 9), r.randint(1, v)
    extra = r.randint(1, v)
    total = friends * each
    q = f"{name} bought {total} {item} and shared them equally among {friends} friends. Each friend then found " \
        f"{extra} more {item}. How many {item} does each friend have now?"
    s = [f"Each friend got {total}/{friends} = <<{total}/{friends}={each}>>{each} {item}.",
         f"Each friend now has {each}+{extra} = <<{each}+{extra}={each + extra}>>{each + extra} {item}."]
    return q, s, each + extra


def _weekly_reading(r, v):
    name, pages, days, weeks = r.choice(NAMES), r.randint(2, v), r.randint(2, 7), r.randint(2, 5)
    week = pages * days
    total = week * weeks
    q = f"{name} reads {pages} pages a day, {days} days a week. How many pages does {name} read in {weeks} weeks?"
    s = [f"In one week {name} reads {pages}*{days} = <<{pages}*{days}={week}>>{week} pages.",
         f"In {weeks} weeks {name} reads {week}*{weeks} = <<{week}*{weeks}={total}>>{total} pages."]
    return q, s, total


def _savings_goal(r, v):
    name, price, saved, per_week = r.choice(NAMES), r.randint(10, 10 * v), 0, r.randint(1, v)
    saved = r.randint(0, price - 1)
    need = price - saved
    weeks = -(-need // per_week)
    q = f"{name} wants a bike that costs ${price}. {name} has saved ${saved} and saves ${per_week} more each " \
        f"week. How many weeks does {name} need to save to afford the bike?"
    s = [f"{name} still needs {price}-{saved} = <<{price}-{saved}={need}>>{need} dollars.",
         f"{need}/{per_week} rounded up is {weeks}, so {name} needs {weeks} weeks."]
    return q, s, weeks


def _two_items_cost(r, v):
    name, a_n, a_p, b_n, b_p = r.choice(NAMES), r.randint(1, 9), r.randint(1, v), r.randint(1, 9), r.randint(1, v)
    a_t, b_t = a_n * a_p, b_n * b_p
    q = f"{name} buys {a_n} notebooks at ${a_p} each and {b_n} pens at ${b_p} each. " \
        f"How much does {name} spend in total?"
    s = [f"The notebooks cost {a_n}*{a_p} = <<{a_n}*{a_p}={a_t}>>{a_t} dollars.",
         f"The pens cost {b_n}*{b_p} = <<{b_n}*{b_p}={b_t}>>{b_t} dollars.",
         f"In total {name} spends {a_t}+{b_t} = <<{a_t}+{b_t}={a_t + b_t}>>{a_t + b_t} dollars."]
    return q, s, a_t + b_t


TEMPLATES = [_sold_two_months, _hourly_pay, _boxes_left, _shared_equally, _weekly_reading, _savings_goal,
             _two_items_cost]


def _validate(knobs: dict) -> None:
    if not isinstance(knobs["max_value"], int) or knobs["max_value"] < 2:
        raise ValueError(f"gsm8k-synthetic knob 'max_value' must be an integer >= 2, got {knobs['max_value']!r}")


def make_example(rng: random.Random, knobs: dict) -> Example:
    question, steps, answer = rng.choice(TEMPLATES)(rng, knobs["max_value"])
    solution = "\n".join(steps) + f"\n#### {answer}"
    return Example(question=question, prompt=f"{question} {INSTRUCTION}", solution=solution,
                   ground_truth=str(answer), extra={"answer": solution, "question": question})


TASK = Task(name="gsm8k-synthetic", data_source="openai/gsm8k", ability="math",
            extra_fields=[("answer", pa.string()), ("question", pa.string())],
            make_example=make_example, defaults={"max_value": 50}, validate=_validate)
