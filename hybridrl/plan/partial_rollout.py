"""The run plan's part for partial rollouts (`actor_rollout_ref.rollout.partial_rollout`): the facts the driver's
buffer (trainer/partial_rollout.py) and the rollout workers read.

Choices:
- A step trains on at most `data.train_batch_size` complete groups (the update keeps the shape and mini-batch count
  it was planned for; more complete groups wait for the next step), in multiples of `group_multiple` so that the
  trained rows split evenly over the update's data-parallel ranks (the dispatch would otherwise repeat rows, which
  an update would train on twice).
- Carried tokens were sampled by older policies: the update weighs them by truncated importance sampling
  against their rollout log-probs. `algorithm.rollout_correction.rollout_is` is used as set; unset (null), it
  becomes `token` with the configured `rollout_is_threshold`, and `hybridrl config check` says so. In bypass mode
  with loss_type ppo_clip the clipped ratio against the rollout's log-probs weighs them instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hybridrl.config.sections.algorithm import RolloutCorrectionConfig

KEY = "actor_rollout_ref.rollout.partial_rollout"
RC = "algorithm.rollout_correction"


@dataclass(frozen=True)
class PartialRolloutPlan:
    tokens_per_step: int        # new tokens a sample may take in one step's generation
    max_staleness: int          # steps a group may wait between its first tokens and the step that trains it
    max_groups: int             # complete groups one step trains on at most (data.train_batch_size)
    group_multiple: int         # trained groups come in multiples of this (rows divide over the update's dp)
    rollout_is: str | None      # the IS level of the update (token when algorithm.rollout_correction leaves it unset;
    #                             None in bypass mode's ppo_clip, whose clipped ratio carries the correction)
    rollout_is_threshold: float

    def __str__(self) -> str:
        return (f"partial rollouts  <= {self.tokens_per_step} new tokens a sample per step, unfinished samples "
                f"carried (groups dropped after {self.max_staleness} steps); a step trains <= {self.max_groups} "
                f"complete groups (multiples of {self.group_multiple}), " + (
                    f"IS {self.rollout_is} truncated at {self.rollout_is_threshold:g}" if self.rollout_is else
                    "the bypass mode's clipped ratio against the sampling policy"))


def plan_partial_rollout(g, n: int, train_batch_size: int, update_dps: list[int],
                         choices: list[str]) -> PartialRolloutPlan | None:
    """The plan of partial rollouts, or None when off. `g` reads a config key; `update_dps`: the data-parallel
    sizes of the updates (actor, and critic with gae)."""
    if not g(f"{KEY}.enable"):
        return None
    dp = math.lcm(*update_dps)
    multiple = dp // math.gcd(dp, n)
    level = g(f"{RC}.rollout_is")
    clipped_ratio = g(f"{RC}.bypass_mode") and g(f"{RC}.loss_type") == "ppo_clip"
    if clipped_ratio:
        choices.append(f"{RC}.bypass_mode with loss_type ppo_clip: carried tokens are weighed by the clipped ratio "
                       "π / π_rollout of the policy that sampled them (no IS weights)")
    elif level is None:
        level = "token"
        choices.append(f"{RC}.rollout_is = token (partial rollouts: carried tokens were sampled by older policies; "
                       f"truncated at rollout_is_threshold = {g(f'{RC}.rollout_is_threshold'):g})")
    return PartialRolloutPlan(tokens_per_step=int(g(f"{KEY}.max_new_tokens_per_step")),
                              max_staleness=int(g(f"{KEY}.max_staleness")), max_groups=train_batch_size,
                              group_multiple=multiple, rollout_is=level,
                              rollout_is_threshold=float(g(f"{RC}.rollout_is_threshold")))


def cohorts_in_flight(g, response_len: int) -> int:
    """How many steps' fresh samples one generate call may hold at most: a sample ends within ceil(response /
    per-step budget) calls, and a group is dropped once it is max_staleness steps old; 1 when partial rollouts are
    off. The engine's concurrency and KV are planned for that many cohorts, so that carried samples decode beside
    the fresh ones rather than in waves after them."""
    if not g(f"{KEY}.enable"):
        return 1
    budget = int(g(f"{KEY}.max_new_tokens_per_step"))
    return max(1, min(-(-response_len // budget), int(g(f"{KEY}.max_staleness")) + 1))


def rollout_correction(section: RolloutCorrectionConfig, plan: PartialRolloutPlan | None) -> RolloutCorrectionConfig:
    """`algorithm.rollout_correction` as the trainer applies it: with partial rollouts, at the plan's IS level."""
    return section if plan is None else replace(section, rollout_is=plan.rollout_is)
