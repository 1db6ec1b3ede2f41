"""A custom reward in verl's signature, for `custom_reward_function.path=examples/my_task/reward.py`
(`custom_reward_function.name=compute_score`, the default name).

The trainer calls compute_score once per sampled response with the row's `data_source`, the decoded response text,
the row's `reward_model.ground_truth` and its `extra_info`. It returns a float (or a dict with a "score" key and
other numbers, which are logged as reward extra info). Here: 1.0 when the number after the last "####" equals the
ground truth, 0.1 when the response has a "####" answer that is wrong (the format alone earns a little, so a model
that never writes it has something to learn from), 0.0 otherwise.
"""

import re

ANSWER = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def extract_answer(text: str) -> str | None:
    """The number after the last '####' in `text` (commas dropped), or None when there is none."""
    found = ANSWER.findall(text)
    return found[-1].replace(",", "") if found else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    try:
        return 1.0 if float(answer) == float(ground_truth) else 0.1
    except ValueError:  # a ground truth that is not a number: compare the text
        return 1.0 if answer == str(ground_truth).strip() else 0.1
