"""verl's rule scorers, reimplemented to give verl's verdict on the same string, and verl's dispatch by data source.

`verl_compute_score(data_source, solution_str, ground_truth, ...)` routes exactly as verl's
`default_compute_score`: GSM8K, MATH (`math_reward`), DAPO math (`math_dapo`, `math`, `math_dapo_reasoning`,
`aime*`), PRIME math (`numina_*`), Geometry3K, Search-R1 QA, and the code sources (`codecontests`, `apps`,
`codeforces`, `taco`: verl's prime_code harness, the program run in hybridrl's sandbox). Results are converted
as verl converts them: a dict is returned as is, a number becomes float, a tuple gives float of its first item.
The `prime_math` and `geometry3k` scorers need sympy and pylatexenc (`pip install 'hybridrl[math]'`).
"""

from __future__ import annotations

import importlib

__all__ = ["CODE_DATA_SOURCES", "EXACT_SOURCES", "verl_compute_score", "verl_scorer_module"]

_MATH_REWARD_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
_DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
_PRIME_MATH_SOURCES = ("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                       "numina_cn_k12", "numina_olympiads")
_SEARCH_R1_SOURCES = ("searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                      "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle")
CODE_DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco")

# data source -> module (in this package) whose compute_score verl uses for it
EXACT_SOURCES = {"openai/gsm8k": "gsm8k", "hiyouga/geometry3k": "geo3k",
                 **dict.fromkeys(_MATH_REWARD_SOURCES, "hendrycks"), **dict.fromkeys(_DAPO_SOURCES, "math_dapo"),
                 **dict.fromkeys(_PRIME_MATH_SOURCES, "prime_math"), **dict.fromkeys(_SEARCH_R1_SOURCES, "search_r1")}


def verl_scorer_module(data_source: str) -> str | None:
    """Name of this package's module that scores `data_source` as verl does, or None when verl has none here."""
    if data_source in EXACT_SOURCES:
        return EXACT_SOURCES[data_source]
    return "math_dapo" if data_source.startswith("aime") else None


def _as_verl_result(result):
    if isinstance(result, dict):
        return result
    if isinstance(result, int | float | bool):
        return float(result)
    return float(result[0])


def verl_compute_score(data_source: str, solution_str: str, ground_truth, extra_info=None,
                       sandbox_fusion_url=None, concurrent_semaphore=None, memory_limit_mb=None, **kwargs):
    if data_source in CODE_DATA_SOURCES:  # verl without sandbox_fusion_url: prime_code, run in the local sandbox
        from hybridrl.rewards.verl_compat import prime_code
        return prime_code.compute_score(solution_str, ground_truth, extra_info)
    module_name = verl_scorer_module(data_source)
    if module_name is None:
        raise NotImplementedError(f"Reward function is not implemented for data_source={data_source!r}")
    module = importlib.import_module(f"{__name__}.{module_name}")
    return _as_verl_result(module.compute_score(solution_str, ground_truth))
