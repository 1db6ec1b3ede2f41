"""Seeds of a run, all derived from `trainer.seed`, so two runs with the same config sample, shuffle and
initialise the same way.

- `seed_everything(trainer.seed)` seeds python's `random`, numpy and torch (CPU and CUDA) in the driver and in
  every worker process at init. Every rank gets the same seed: model weights come from the checkpoint (a
  randomly initialised head, like the critic's value head, is broadcast from rank 0), and the rollout engine
  draws from its own generator seeded per call, so nothing needs ranks to differ here.
- `step_sampling_seed` is the rollout seed of one training step, from trainer.seed, rollout.seed and the step:
  a resumed run samples at step k what the original did. Each rollout data-parallel group adds its dp rank
  (`rollout.seed` is documented "offset by dp rank"): groups draw different random streams, while the TP ranks
  of one group share the group's seed and so sample the same tokens without a broadcast.
- `shuffle_seed` seeds the mini-batch shuffle (`actor.shuffle`, `critic.shuffle`) of one step.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

__all__ = ["derive_seed", "seed_everything", "shuffle_seed", "step_sampling_seed", "validation_sampling_seed"]

_SEED_SPACE = 2**31  # fits numpy's and every sampler's seed range; dp-rank offsets stay far below 2**63


def derive_seed(*parts) -> int:
    """A seed in [0, 2**31) from any parts (ints, strings): equal parts give equal seeds, near-equal ones
    (seed 1 step 2 vs seed 2 step 1) unrelated seeds."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % _SEED_SPACE


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too


def step_sampling_seed(trainer_seed: int, rollout_seed: int, step: int) -> int:
    """The rollout seed of training step `step`, before the dp-rank offset the worker adds."""
    return derive_seed("sampling", int(trainer_seed), int(rollout_seed), int(step))


def validation_sampling_seed(trainer_seed: int, rollout_seed: int, batch: int = 0) -> int:
    """The seed of validation batch `batch`: the same at every validation, so sampled validations at different steps
    are compared on equal draws; another for each batch of one validation, so its batches draw independently."""
    if batch == 0:
        return derive_seed("validation", int(trainer_seed), int(rollout_seed))
    return derive_seed("validation", int(trainer_seed), int(rollout_seed), int(batch))


def shuffle_seed(trainer_seed: int, step: int) -> int:
    return derive_seed("shuffle", int(trainer_seed), int(step))
