"""RewardManager: turn rollout responses into token-level scores [B, R] (verl's naive / batch managers).

- A multi-turn trajectory's extra_info also holds `num_turns`, `turn_scores` (its interaction's) and `tool_rewards`
  (its class tools' step rewards), as verl's managers add them.
- Each response is decoded from its valid tokens as verl decodes it (`responses` where the attention mask is 1:
  in a multi-turn trajectory the tool and user messages and the template text between turns too; special tokens
  skipped) and scored with `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` (naive; by
  keyword, as verl calls it, so any parameter order works) or once per batch with
  `compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=)` (batch).
- The score goes on the last valid response token, zeros elsewhere. A scorer returning a dict contributes its
  "score"; all its keys (like verl, "score" included) land in `reward_extra_info`, one entry per sample (None where
  a sample had no such key).
- A scorer that raises, returns a non-number (a string such as "0.5" included: only int, float, bool and numpy
  numbers count, as in verl) or a non-finite one (NaN, inf, -inf), or overruns `timeout_s` gives 0
  for that sample and is counted (`reward/errors`, `reward/timeouts`); the run goes on (the trainer stops it when
  too many samples fail: rewards/error_guard.py). A sample whose ground truth is missing (None or NaN) counts in
  `reward/missing_ground_truths`; the default scorer does not score it (0, counted as an error), a custom function
  gets it as None (as in verl: length, format or judge rewards need none). `reward/samples` is the
  batch size. With a timeout the scorer runs in a worker process that is replaced when it overruns
  (score_worker.py); a scorer that times out on the first HUNG_AFTER samples of a call without scoring one stops the
  run at once (RewardErrorLimitError: it hangs on every input, and timing out on each would take hours). In batch
  mode the deadline is timeout_s × batch size and a failure zeroes (and counts) every sample of the batch.
  `timeout_s=None` scores in-process with no limit. With `workers` > 1 (naive mode) that many worker processes score
  the samples at once, each sample within timeout_s (a sandboxed or slow scorer's step time divided by about that
  many); the hang check then reads the first HUNG_AFTER results to finish.
- With the default scorer, a data_source it has no scorer for fails the call with the reason (a config error, not
  a sample error).
- An empty response (no valid token) is still scored (on ""); its score cannot sit on a valid token, so it is
  put at position 0 and counted in `reward/empty_responses`.
- Model-based rewards (`reward_model.enable`): the batch carries `rm_scores` [B, R] (the reward model's or the
  judge's score at the last response token). As in verl, that score is then the reward and no rule scorer runs
  (no ground truth is needed); a non-finite one is an error, scored 0. A custom function that takes an
  `rm_score` argument (`rm_scores`, a list, in batch mode) combines the two instead: it is called as usual plus
  the sample's reward-model score, and what it returns is the reward.
- `overlong_buffer` (DAPO's soft overlong punishment, verl's DAPORewardManager): with L the valid response length
  (the response part of the attention mask), M the max response length and B the buffer length, the reward gets
  min(-(L - (M - B)) / B × penalty_factor, 0) added: 0 up to M - B tokens, then falling linearly to
  -penalty_factor at M. It applies to every sample, failed ones included (the length is known). Counted in
  `reward/overlong_samples` (penalised samples) and `reward/overlong_reward_mean`; with `log` also in
  `reward_extra_info` as verl's `overlong_reward` and `overlong`.
- Agent loops (rollout/agent_loop.py): a sample whose loop returned a reward (`agent_reward`, not None) takes it as
  its score (validated as any score) and is not sent to the scorer; when every sample has one, no scorer runs.
- The result's `scores` list holds each sample's score as the scorer gave it (0 when it failed), before the
  overlong penalty (dynamic sampling filters on it).
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import queue
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.default import default_compute_score, unscorable_sources_error
from hybridrl.rewards.error_guard import RewardErrorLimitError
from hybridrl.rewards.score_worker import ScorerProcess

__all__ = ["OverlongBuffer", "RewardManager", "default_compute_score_batch", "overlong_reward", "takes_rm_score"]

FLOAT32_MAX = 3.4028234663852886e38
HUNG_AFTER = 8   # timeouts in a row, from a call's first sample, that mean the scorer hangs on every input
# what a multi-turn trajectory adds to its extra_info for the scorer, under verl's names
MULTI_TURN_EXTRAS = ("num_turns", "turn_scores", "tool_rewards")

log = logging.getLogger(__name__)
MODES = ("naive", "batch")


MISSING_TRUTH = "no ground truth (reward_model.ground_truth is None or NaN in the data): not scored"


def _missing(ground_truth) -> bool:
    return ground_truth is None or (isinstance(ground_truth, float) and math.isnan(ground_truth))


def takes_rm_score(compute_score, mode: str = "naive") -> bool:
    """Whether a scorer combines rule and reward-model scores: it names an `rm_score` (naive) / `rm_scores` (batch)
    parameter."""
    fn = getattr(compute_score, "function", compute_score)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return ("rm_score" if mode == "naive" else "rm_scores") in params


def default_compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos):
    """The batch-mode form of default_compute_score (one call, a list back)."""
    return [default_compute_score(ds, s, gt, ei)
            for ds, s, gt, ei in zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True)]


@dataclass(frozen=True)
class OverlongBuffer:
    """reward_model.overlong_buffer (enabled) with data.max_response_length."""
    length: int
    penalty_factor: float
    max_response_length: int
    log: bool = False

    def __post_init__(self):
        if not 0 < self.length <= self.max_response_length:
            raise ValueError(f"reward_model.overlong_buffer.len={self.length}: must be in (0, data.max_response_length"
                             f"={self.max_response_length}]")
        if not self.penalty_factor >= 0:
            raise ValueError(f"reward_model.overlong_buffer.penalty_factor={self.penalty_factor}: must be >= 0")


def overlong_reward(valid_length: int, buffer: OverlongBuffer) -> float:
    """DAPO's soft overlong penalty (<= 0) of a response of `valid_length` tokens."""
    exceed = valid_length - (buffer.max_response_length - buffer.length)
    return min(-exceed / buffer.length * buffer.penalty_factor, 0.0)


class RewardManager:
    def __init__(self, tokenizer, compute_score=None, reward_fn_key: str = "data_source",
                 timeout_s: float | None = 10.0, mode: str = "naive", num_examine: int = 0,
                 overlong_buffer: OverlongBuffer | None = None, workers: int = 1):
        if mode not in MODES:
            raise ValueError(f"reward_model.reward_manager={mode!r}: must be one of {MODES}")
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"reward_model.timeout_s={timeout_s!r}: must be a positive number or null (no limit)")
        self.tokenizer, self.reward_fn_key, self.mode = tokenizer, reward_fn_key, mode
        self.overlong_buffer = overlong_buffer
        self.timeout_s, self.num_examine = timeout_s, num_examine
        # a custom function decides what a missing ground truth means; the default scorers cannot score one
        self.scores_missing_truths = compute_score is not None
        self.compute_score = compute_score or (default_compute_score if mode == "naive" else default_compute_score_batch)
        self.combines_rm = takes_rm_score(self.compute_score, mode)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"reward_model.scorer_workers={workers!r}: must be an integer >= 1")
        # the per-sample scorer's worker processes (started at their first call); one in batch mode or in-process
        count = workers if mode == "naive" and timeout_s is not None else 1
        self._workers = [ScorerProcess(self.compute_score) for _ in range(count)] if timeout_s is not None else []
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        for worker in self._workers:
            self._idle.put(worker)

    def close(self) -> None:
        for worker in self._workers:
            worker.close()

    # ------------------------------------------------------------------ scoring
    def _call(self, args: tuple, kwargs: dict | None, budget_s: float | None) -> tuple[str, object]:
        """One scorer call on an idle worker process (in-process without a timeout)."""
        if not self._workers:
            try:
                return "ok", self.compute_score(*args, **(kwargs or {}))
            except Exception as e:
                return "error", repr(e)
        worker = self._idle.get()
        try:
            return worker.call(args, kwargs, budget_s)
        finally:
            self._idle.put(worker)

    def _score_all(self, sources, texts, truths, extras, rm_scores, skip=()) -> list[tuple[str, object]]:
        """(status, value) per sample; samples without a ground truth, or in `skip` (scored by their agent loop), are
        not sent to the scorer. `rm_scores`: a float per sample for a scorer that combines them, else None."""
        results: list[tuple[str, object]] = [("error", MISSING_TRUTH)] * len(texts)
        have = [i for i, gt in enumerate(truths) if i not in skip and (self.scores_missing_truths or not _missing(gt))]
        if have:
            pick = lambda xs: None if xs is None else [xs[i] for i in have]  # noqa: E731
            for i, r in zip(have, self._score_present(pick(sources), pick(texts), pick(truths), pick(extras),
                                                      pick(rm_scores))):
                results[i] = r
        return results

    def _score_present(self, sources, texts, truths, extras, rm_scores) -> list[tuple[str, object]]:
        if self.mode == "naive":
            rm = [None] * len(texts) if rm_scores is None else [{"rm_score": x} for x in rm_scores]
            calls = [{"data_source": ds, "solution_str": s, "ground_truth": gt, "extra_info": ei, **(kw or {})}
                     for ds, s, gt, ei, kw in zip(sources, texts, truths, extras, rm)]
            if len(self._workers) > 1 and len(calls) > 1:
                return self._score_concurrently(calls)
            results = []
            for kwargs in calls:
                results.append(self._call((), kwargs, self.timeout_s))
                self._stop_if_hung(results, len(texts))
            return results
        budget = None if self.timeout_s is None else self.timeout_s * len(texts)
        rm = {} if rm_scores is None else {"rm_scores": rm_scores}
        status, value = self._call((), {"data_sources": sources, "solution_strs": texts, "ground_truths": truths,
                                        "extra_infos": extras, **rm}, budget)
        if status == "ok" and (not isinstance(value, (list, tuple)) or len(value) != len(texts)):
            status, value = "error", f"batch compute_score must return a list of {len(texts)} scores, got {value!r}"[:500]
        return list(zip(["ok"] * len(texts), value)) if status == "ok" else [(status, value)] * len(texts)

    def _score_concurrently(self, calls: list[dict]) -> list[tuple[str, object]]:
        """The samples on every worker process at once, each within timeout_s; results in sample order. The hang
        check reads the results in the order they finish."""
        results: list = [None] * len(calls)
        finished: list = []
        with ThreadPoolExecutor(max_workers=len(self._workers), thread_name_prefix="reward-scorer") as pool:
            futures = {pool.submit(self._call, (), kwargs, self.timeout_s): i for i, kwargs in enumerate(calls)}
            try:
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    finished.append(results[futures[future]])
                    self._stop_if_hung(finished, len(calls))
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        return results

    def _stop_if_hung(self, results: list, total: int) -> None:
        """A scorer that has timed out on the first HUNG_AFTER samples of a call and scored none hangs on every
        input: going on would take timeout_s per sample of the step (hours at thousands of samples) for the same
        verdict, so the run stops here, saying so."""
        if len(results) == HUNG_AFTER < total and all(status == "timeout" for status, _ in results):
            raise RewardErrorLimitError(
                f"the reward scorer gave no score within reward_model.timeout_s={self.timeout_s} for each of the "
                f"first {HUNG_AFTER} samples of {total} and scored none: it appears to hang on every input; fix it, "
                "or raise reward_model.timeout_s if it is only slow")

    @staticmethod
    def _as_score(value) -> tuple[float, dict]:
        extra = dict(value) if isinstance(value, dict) else {}
        raw = value["score"] if isinstance(value, dict) else value
        if not isinstance(raw, numbers.Real):  # "0.5" is refused, as verl's tensor assignment refuses it
            raise TypeError(f"a score must be a number (or a dict with a numeric 'score'), got {type(raw).__name__}")
        score = float(raw)  # TypeError / KeyError / ValueError are the caller's "error"
        if not math.isfinite(score):  # one inf turns every advantage of its group (or batch) into NaN
            raise ValueError(f"score is {score} (not finite)")
        if abs(score) > FLOAT32_MAX:   # the reward tensor is fp32: it would be inf there
            raise ValueError(f"score is {score:g}, beyond float32's range (|x| <= {FLOAT32_MAX:g})")
        return score, extra

    def _rule_inputs(self, data: DataProto) -> tuple[list[str], list, list]:
        """(data sources, ground truths, extra infos) of a batch, refused when the rule scorer cannot use them."""
        if self.reward_fn_key not in data.non_tensor_batch:
            raise ValueError(f"data.reward_fn_key={self.reward_fn_key!r}: no such non-tensor key in the batch "
                             f"(have {sorted(data.non_tensor_batch)})")
        sources = [str(s) for s in data.non_tensor_batch[self.reward_fn_key]]
        if self.compute_score in (default_compute_score, default_compute_score_batch):
            problem = unscorable_sources_error(sources, self.reward_fn_key)
            if problem:
                raise ValueError(problem)
        truths = [rm.get("ground_truth") if isinstance(rm, dict) else None
                  for rm in data.non_tensor_batch["reward_model"]]
        extras = list(data.non_tensor_batch["extra_info"]) if "extra_info" in data.non_tensor_batch else [None] * len(data)
        turns = data.non_tensor_batch.get("multi_turn_stats")
        if turns is not None:   # as verl's managers add them for multi-turn scorers
            extras = [{**(e if isinstance(e, dict) else {}), **{k: st.get(k) for k in MULTI_TURN_EXTRAS if k in st}}
                      for e, st in zip(extras, turns)]
        # verl's naive manager gives every scorer these two keys (None / {} outside an agent loop)
        extras = [{"num_turns": None, "rollout_reward_scores": {}, **(e if isinstance(e, dict) else {})}
                  for e in extras]
        return sources, truths, extras

    # ------------------------------------------------------------------ entry point
    def __call__(self, data: DataProto) -> dict:
        responses = data.batch["responses"]
        bsz, resp_len = responses.shape
        mask = data.batch.get("response_mask")
        if mask is None:
            mask = data.batch["attention_mask"][:, -resp_len:]
        valid = mask.bool().cpu()
        attention = data.batch.get("attention_mask")  # verl measures the length and decodes on the attention mask
        attended = (attention[:, -resp_len:] if attention is not None else mask).bool().cpu()
        lengths = attended.sum(-1).tolist()
        texts = [self.tokenizer.decode(responses[i].cpu()[attended[i]].tolist(), skip_special_tokens=True)
                 for i in range(bsz)]
        rm = data.batch.get("rm_scores")
        rm_list = None if rm is None else rm.float().sum(-1).tolist()  # one non-zero token per row
        given = {i: r for i, r in enumerate(data.non_tensor_batch.get("agent_reward", [])) if r is not None}
        if (rm_list is not None and not self.combines_rm) or len(given) == bsz:
            # verl: the reward model's score is the reward; an agent loop's reward is too
            sources = [str(s) for s in data.non_tensor_batch.get(self.reward_fn_key, ["agent_loop"] * bsz)]
            truths, results = [None] * bsz, [("ok", x) for x in (rm_list or [0.0] * bsz)]
            missing = 0
        else:
            sources, truths, extras = self._rule_inputs(data)
            results = self._score_all(sources, texts, truths, extras, rm_list, skip=given)
            missing = sum(_missing(t) for i, t in enumerate(truths) if i not in given)
        for i, r in given.items():
            results[i] = ("ok", r)

        reward = torch.zeros(bsz, resp_len, dtype=torch.float32)
        errors = timeouts = empty = 0
        extra_info: dict[str, list] = {}
        scores: list[float] = []
        penalties: list[float] = []
        for i, (status, value) in enumerate(results):
            score, extra = 0.0, {}
            if status == "ok":
                try:
                    score, extra = self._as_score(value)
                except (TypeError, KeyError, ValueError) as e:
                    status, value = "error", f"unusable score {value!r}: {e!r}"[:500]
            if status == "timeout":
                timeouts += 1
                if timeouts <= 3:
                    log.warning("reward scorer gave no score for sample %d (data_source=%r) within "
                                "reward_model.timeout_s=%s", i, sources[i], self.timeout_s)
            elif status == "error":
                errors += 1
                if errors <= 3:
                    log.warning("reward scorer failed on sample %d (data_source=%r): %s", i, sources[i], value)
            for key, v in extra.items():
                extra_info.setdefault(key, [None] * bsz)[i] = v
            scores.append(score)
            total = score
            if self.overlong_buffer is not None:
                penalties.append(overlong_reward(int(lengths[i]), self.overlong_buffer))
                total += penalties[-1]
            positions = valid[i].nonzero()
            if len(positions) == 0:
                empty += 1
                reward[i, 0] = total
            else:
                reward[i, positions[-1, 0]] = total
            if i < self.num_examine:
                log.info("[reward] data_source=%s score=%s response=%r ground_truth=%r", sources[i], score,
                         texts[i][-500:], truths[i])
        metrics = {"reward/errors": errors, "reward/timeouts": timeouts, "reward/empty_responses": empty,
                   "reward/missing_ground_truths": missing, "reward/samples": bsz}
        if self.overlong_buffer is not None:
            metrics["reward/overlong_samples"] = sum(p < 0 for p in penalties)
            metrics["reward/overlong_reward_mean"] = sum(penalties) / max(1, bsz)
            if self.overlong_buffer.log:
                extra_info["overlong_reward"] = penalties
                extra_info["overlong"] = [p < 0 for p in penalties]
        return {"reward_tensor": reward.to(responses.device), "reward_extra_info": extra_info, "metrics": metrics,
                "scores": scores}
