"""`default_compute_score`: pick the rule scorer from a sample's data_source.

- verl's data sources get verl's verdict (`hybridrl.rewards.verl_compat`), so reward curves compare with verl's.
- The project's own tasks keep their scorers: `countdown`, `arith`, `bignum` (exact integer), and the lenient
  comparisons under their own names, `hybridrl/lenient_numeric` (GSM8K-style `#### N`, compared as numbers) and
  `hybridrl/lenient_math` (`\\boxed{}` answers, equal fractions accepted).
- verl's code sources raise NotImplementedError naming the sandbox they need; an unknown source is a ValueError
  naming the known ones — a silent 0 would train on noise.
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
    """True when default_compute_score has a rule scorer for `data_source`: a name in SCORERS or one verl's
    dispatch routes to a scorer here (e.g. any name starting with 'aime')."""
    return data_source in SCORERS or verl_scorer_module(data_source) is not None


def unscorable_sources_error(sources, reward_fn_key: str = "data_source") -> str | None:
    """Why default_compute_score cannot score some of `sources` (code sources: no sandbox; others: unknown),
    or None when it can score them all."""
    code = sorted({s for s in sources if s in CODE_DATA_SOURCES})
    unknown = sorted({s for s in sources if s not in CODE_DATA_SOURCES and not is_scorable(s)})
    problems = []
    if code:
        problems.append(f"data_source(s) {code} need a code sandbox: they are scored by running the generated code "
                        "against test cases, and hybridrl has no code-execution service")
    if unknown:
        problems.append(f"no rule scorer for data_source(s) {unknown}; known: {sorted(SCORERS)} and any name "
                        "starting with 'aime'")
    if not problems:
        return None
    return (f"reward (key data.reward_fn_key={reward_fn_key!r}): " + "; ".join(problems)
            + ". Set custom_reward_function.path to score them.")


def default_compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None, **kwargs):
    scorer = SCORERS.get(data_source)
    if scorer is not None:
        return scorer(solution_str, ground_truth)
    if data_source in CODE_DATA_SOURCES or verl_scorer_module(data_source) is not None:
        return verl_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    raise ValueError(f"default_compute_score: no rule scorer for data_source={data_source!r}; known: "
                     f"{sorted(SCORERS)} and any name starting with 'aime'. "
                     f"Set custom_reward_function.path to score other sources.")
