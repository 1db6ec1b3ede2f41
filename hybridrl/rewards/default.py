"""`default_compute_score`: pick the rule scorer from a sample's data_source.

- verl's data sources get verl's verdict (`hybridrl.rewards.verl_compat`), so reward curves compare with verl's.
- The project's own tasks keep their scorers: `countdown`, `arith`, `bignum` (exact integer), and the lenient
  comparisons under their own names, `hybridrl/lenient_numeric` (GSM8K-style `#### N`, compared as numbers) and
  `hybridrl/lenient_math` (`\\boxed{}` answers, equal fractions accepted).
- verl's code sources (`codecontests`, `apps`, `codeforces`, `taco`) run the program against the sample's test cases
  in the sandbox, judged as verl's prime_code judges them (verl_compat/prime_code.py).
- An unknown source is a ValueError naming the known ones — a silent 0 would train on noise.
"""

from __future__ import annotations

from functools import partial

from hybridrl.rewards import arith, bignum, code_exec, countdown, lenient_math, lenient_numeric
from hybridrl.rewards.verl_compat import (
    CODE_DATA_SOURCES,
    EXACT_SOURCES,
    verl_compute_score,
    verl_scorer_module,
)

__all__ = ["LENIENT_MATH", "LENIENT_NUMERIC", "SCORERS", "default_compute_score", "is_scorable",
           "unscorable_sources_error"]

LENIENT_NUMERIC = "hybridrl/lenient_numeric"
LENIENT_MATH = "hybridrl/lenient_math"
# verl routes every source starting with "aime" to math_dapo; these are the names its recipes use
_AIME_NAMES = ("aime", "aime24", "aime25", "aime2024", "aime2025")

SCORERS = {
    **{source: partial(verl_compute_score, source) for source in (*EXACT_SOURCES, *_AIME_NAMES)},
    "countdown": countdown.compute_score,
    "arith": arith.compute_score,
    "bignum": bignum.compute_score,
    LENIENT_NUMERIC: lenient_numeric.compute_score,
    LENIENT_MATH: lenient_math.compute_score,
    code_exec.DATA_SOURCE: partial(code_exec.compute_score, code_exec.DATA_SOURCE),
}


def is_scorable(data_source: str) -> bool:
    """True when default_compute_score has a scorer for `data_source`: a name in SCORERS, one of verl's code
    sources, or one verl's dispatch routes to a scorer here (e.g. any name starting with 'aime')."""
    return data_source in SCORERS or data_source in CODE_DATA_SOURCES or verl_scorer_module(data_source) is not None


def unscorable_sources_error(sources, reward_fn_key: str = "data_source") -> str | None:
    """Why default_compute_score cannot score some of `sources` (no rule scorer), or None when it can score them
    all."""
    unknown = sorted({s for s in sources if not is_scorable(s)})
    if not unknown:
        return None
    return (f"reward (key data.reward_fn_key={reward_fn_key!r}): no rule scorer for data_source(s) {unknown}; "
            f"known: {sorted(SCORERS)}, verl's code sources {list(CODE_DATA_SOURCES)} and any name starting with "
            "'aime'. Set custom_reward_function.path to score them.")


def default_compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None, **kwargs):
    scorer = SCORERS.get(data_source)
    if scorer is not None:
        return scorer(solution_str, ground_truth)
    if data_source in CODE_DATA_SOURCES or verl_scorer_module(data_source) is not None:
        return verl_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    raise ValueError(f"default_compute_score: no rule scorer for data_source={data_source!r}; known: "
                     f"{sorted(SCORERS)}, verl's code sources {list(CODE_DATA_SOURCES)} and any name starting with "
                     "'aime'. "
                     f"Set custom_reward_function.path to score other sources.")
