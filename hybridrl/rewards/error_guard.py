"""Stops a run whose rewards mostly failed to score, instead of training on the zeros they were replaced by.

A sample whose scorer raised, returned a non-finite or non-number score, timed out, or had no ground truth gets
reward 0 and is counted (reward_manager.py). A few such samples are noise; when most of them fail, the rewards
say nothing about the responses and every update trains on zeros while the run exits 0. The guard sums the
failed samples (`reward/errors` + `reward/timeouts`, and with an LLM judge the verdicts it could not read,
`reward_model/judge_failures`; at most the step's samples) over the last `window` steps and raises once their share
of the samples reaches `max_fraction` (config `reward_model.max_error_fraction` / `error_window_steps`; the
default 1.0 over 1 step stops only when every sample of a step failed; null never stops).
"""

from __future__ import annotations

from collections import deque

from hybridrl.config.errors import RunStopError

__all__ = ["FAILURE_KEYS", "RewardErrorGuard", "RewardErrorLimitError"]

FAILURE_KEYS = ("reward/errors", "reward/timeouts", "reward_model/judge_failures")


class RewardErrorLimitError(RuntimeError, RunStopError):
    """Too many samples failed to score; the message gives the counts, the limit and the keys that set it."""


class RewardErrorGuard:
    def __init__(self, max_fraction: float | None = 1.0, window: int = 1):
        if max_fraction is not None and not 0 < max_fraction <= 1:
            raise ValueError(f"reward_model.max_error_fraction={max_fraction!r}: must be in (0, 1] or null (never stop)")
        if window < 1:
            raise ValueError(f"reward_model.error_window_steps={window!r}: must be >= 1")
        self.max_fraction, self.window = max_fraction, window
        self._steps: deque[tuple[int, int, int]] = deque(maxlen=window)  # (step, failed, samples)

    def check(self, step: int, metrics: dict) -> float:
        """Record one step's reward metrics; returns the failed fraction over the window, raises past the limit."""
        samples = int(metrics.get("reward/samples", 0))
        failed = min(samples, sum(int(metrics.get(k, 0)) for k in FAILURE_KEYS))
        self._steps.append((step, failed, samples))
        total_failed = sum(f for _, f, _ in self._steps)
        total = sum(n for _, _, n in self._steps)
        fraction = total_failed / total if total else 0.0
        if self.max_fraction is not None and total_failed and fraction >= self.max_fraction:
            first = self._steps[0][0]
            span = f"step {step}" if first == step else f"steps {first}-{step}"
            raise RewardErrorLimitError(
                f"reward scoring failed on {total_failed} of {total} samples in {span} ({fraction:.0%}), which "
                f"reaches reward_model.max_error_fraction={self.max_fraction} over "
                f"reward_model.error_window_steps={self.window}; their rewards (0 each) carry no signal to "
                "train on. The reward warnings above name the failures (a scorer raising, non-finite "
                "scores, timeouts, missing ground truths); fix the scorer or the data, or raise the limit")
        return fraction

    def state_dict(self) -> dict:
        """The window's steps, saved with a checkpoint so a resumed run counts the failures before it."""
        return {"steps": [list(s) for s in self._steps]}

    def load_state_dict(self, state: dict) -> None:
        self._steps.clear()
        self._steps.extend(tuple(int(x) for x in s) for s in state.get("steps", []))   # the window keeps the last ones
