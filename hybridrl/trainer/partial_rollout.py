"""Partial rollouts on the driver (`actor_rollout_ref.rollout.partial_rollout`, Kimi k1.5 / APRIL / AReaL style):
the prompt groups in flight across steps.

A step's generation is its new prompts (n fresh samples each) plus every unfinished sample carried from earlier
steps (its tokens and their rollout log-probs so far). The engine gives each sample at most the plan's per-step
token budget, re-prefilling a carried one with the current weights; a sample that ends (eos, stop, length) is
finished, one the budget stopped is carried again. A group trains once all n samples are finished.

Choices:
- Policy version = step: a token sampled in step v and trained in step t is t - v steps stale; the weights of step
  v are those after v - 1 updates. A group's age is the staleness of its oldest tokens (its first step).
- A step trains the oldest complete groups, at most `max_groups` (data.train_batch_size) and in multiples of
  `group_multiple` (rows divide over the update's data-parallel ranks): the update keeps its planned shape.
  Complete groups beyond that wait; the finished samples of incomplete groups wait too. No group complete: the
  step generates and trains nothing (metrics say so), which happens in the first steps when every group has a
  sample longer than the budget.
- After the step, a group that would be older than `max_staleness` at the next step is dropped whole and counted
  (`partial/dropped_stale`), never trained.
- The trained batch has the rollout's keys (outputs_to_dataproto): its `rollout_log_probs` are those of the
  policies that sampled each token, which the update's truncated importance sampling weighs against.
- `state_dict` / `load_state_dict`: the groups in flight, saved with each checkpoint so a resumed run continues them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from hybridrl.plan.partial_rollout import PartialRolloutPlan
from hybridrl.protocol import DataProto
from hybridrl.rollout.sampling_params import BUDGET, CompletionOutput, RequestOutput
from hybridrl.rollout.to_dataproto import CARRIED_KEYS, outputs_to_dataproto

__all__ = ["PartialRolloutBuffer", "STATE_FILE"]

STATE_FILE = "partial_rollout.pt"   # in a checkpoint directory: the groups in flight
REQUEST_TENSORS = ["input_ids", "attention_mask", "position_ids"]
REQUEST_NON_TENSORS = ["raw_prompt_ids", "uid"]


@dataclass
class Sample:
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)     # of the policy that sampled each token
    steps: list[tuple[int, int]] = field(default_factory=list)  # (step, tokens sampled in it), in order
    finish_reason: str | None = None                         # None while unfinished


@dataclass
class Group:
    prompt: DataProto           # the prompt's row: its tensors and non-tensor fields (uid, ground truth, ...)
    samples: list[Sample]
    first_step: int

    @property
    def complete(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)


class PartialRolloutBuffer:
    def __init__(self, plan: PartialRolloutPlan, n: int):
        self.plan, self.n = plan, n
        self.groups: list[Group] = []
        self._rows: list[tuple[Group, Sample]] = []   # the last requests' rows
        self._step_counts: dict[str, float] = {}

    # ------------------------------------------------------------------ one step
    def add_prompts(self, batch: DataProto, step: int) -> None:
        """The step's new prompts (with their uids), n fresh samples each."""
        for i in range(len(batch)):
            self.groups.append(Group(batch.slice(i, i + 1), [Sample() for _ in range(self.n)], step))

    def requests(self) -> DataProto:
        """One row per unfinished sample (a fresh group's n samples adjacent): the prompt and what it carries."""
        self._rows = [(g, s) for g in self.groups for s in g.samples if s.finish_reason is None]
        prompts = DataProto.concat([g.prompt.select(REQUEST_TENSORS, [k for k in REQUEST_NON_TENSORS
                                                                     if k in g.prompt.non_tensor_batch])
                                    for g, _ in self._rows])
        prompts.meta_info = {}
        carried = {CARRIED_KEYS[0]: [s.token_ids for _, s in self._rows],
                   CARRIED_KEYS[1]: [s.log_probs for _, s in self._rows]}
        self._step_counts = {"partial/continued_samples": float(sum(bool(s.token_ids) for _, s in self._rows))}
        return prompts.union(DataProto.from_dict(non_tensors=carried))

    def absorb(self, out: DataProto, step: int) -> None:
        """The completions of the last requests (row order): each sample's tokens so far and how it stopped."""
        nt = out.non_tensor_batch
        if len(out) != len(self._rows):
            raise ValueError(f"partial rollouts: {len(out)} completions for {len(self._rows)} requested samples")
        stopped = 0
        for (_, s), ids, log_probs, reason in zip(self._rows, nt["token_ids"], nt["log_probs"], nt["finish_reason"]):
            s.steps.append((step, len(ids) - len(s.token_ids)))
            s.token_ids, s.log_probs = list(ids), list(log_probs)
            s.finish_reason = None if reason == BUDGET else str(reason)
            stopped += reason == BUDGET
        self._step_counts["partial/budget_stopped_samples"] = float(stopped)
        self._rows = []

    def take(self, step: int, response_length: int, pad_token_id: int) -> tuple[DataProto | None, dict]:
        """(the batch this step trains on, or None; the step's partial/ metrics). Drops the groups too old to wait."""
        complete = [g for g in self.groups if g.complete]
        k = min(len(complete), self.plan.max_groups) // self.plan.group_multiple * self.plan.group_multiple
        trained = complete[:k]
        taken = {id(g) for g in trained}
        waiting = [g for g in self.groups if id(g) not in taken]
        self.groups = [g for g in waiting if step + 1 - g.first_step <= self.plan.max_staleness]
        metrics = {**self._step_counts, **staleness_metrics(trained, step),
                   "partial/trained_groups": float(len(trained)),
                   "partial/dropped_stale": float(len(waiting) - len(self.groups)),
                   "partial/carried_groups": float(len(self.groups)),
                   "partial/carried_samples": float(sum(s.finish_reason is None for g in self.groups
                                                        for s in g.samples))}
        return (to_batch(trained, response_length, pad_token_id) if trained else None), metrics

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"groups": [{"prompt": {"batch": g.prompt.batch, "non_tensor_batch": {
            k: v.tolist() for k, v in g.prompt.non_tensor_batch.items()}}, "first_step": g.first_step,
            "samples": [asdict(s) for s in g.samples]} for g in self.groups]}

    def load_state_dict(self, state: dict) -> None:
        self.groups = []
        for g in state["groups"]:
            samples = [Sample(**{**s, "steps": [tuple(x) for x in s["steps"]]}) for s in g["samples"]]
            if len(samples) != self.n:
                raise ValueError(f"partial rollouts: the checkpoint's groups have {len(samples)} samples but "
                                 f"actor_rollout_ref.rollout.n = {self.n}; resume with the saved n")
            self.groups.append(Group(DataProto.from_dict(g["prompt"]["batch"], g["prompt"]["non_tensor_batch"]),
                                     samples, int(g["first_step"])))


def staleness_metrics(groups: list[Group], step: int) -> dict[str, float]:
    """Over the trained tokens: mean and max staleness (steps) and the share sampled by an older policy."""
    tokens = np.array([[step - v, count] for g in groups for s in g.samples for v, count in s.steps if count],
                      dtype=np.float64).reshape(-1, 2)
    total = tokens[:, 1].sum()
    if total == 0:
        return {}
    return {"partial/mean_staleness": float((tokens[:, 0] * tokens[:, 1]).sum() / total),
            "partial/max_staleness": float(tokens[:, 0].max()),
            "partial/off_policy_token_frac": float(tokens[tokens[:, 0] > 0, 1].sum() / total)}


def to_batch(groups: list[Group], response_length: int, pad_token_id: int) -> DataProto:
    """The complete groups as a rollout batch (the keys of docs/CONTRACTS.md), the n samples of a group adjacent."""
    prompts = DataProto.concat([g.prompt for g in groups])
    outputs = [RequestOutput(i, [], [CompletionOutput(j, s.token_ids, s.log_probs, s.finish_reason)
                                     for j, s in enumerate(g.samples)]) for i, g in enumerate(groups)]
    return outputs_to_dataproto(prompts, outputs, response_length=response_length, pad_token_id=pad_token_id)
