"""Reward for the SmolLM2 addition recipe: 1.0 when the response's last integer equals the ground truth, else 0.0.

The instruct model answers in free text ("To add 7 and 5 ... 7 + 5 = 12."), so no answer format is imposed: the
last integer it writes is its answer. Used through `custom_reward_function.path` (verl's signature).
"""

import re

INTEGER = re.compile(r"-?\d+")


def last_integer(text: str) -> int | None:
    """The last integer in `text` (digits with an optional minus sign), None when there is none."""
    found = INTEGER.findall(text)
    return int(found[-1]) if found else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return float(last_integer(solution_str) == int(ground_truth))
