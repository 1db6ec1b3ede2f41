"""The driver's step with the early update (plan: `actor.early_update`, plan/early_update.py says where it is on).

The rollout streams its finished prompt groups (workers/early_update.py); the driver scores each batch of them —
rewards, the reference's log-probs, advantages from the group's own rewards — and sends it to the actor, which
accumulates its gradients while the other groups still decode. After the last group the actor puts the gradient on
the whole batch's normaliser and steps once: the same update as the step that waits for the whole rollout, started
during the rollout's tail instead of after it.

Metrics beside the usual ones: `actor/early_update_frac` (the share of the step's samples whose forward and backward
began before the rollout ended) and `timing_s/update_after_gen` (how long the step waited for the update after the
rollout; `timing_s/update_actor` is the whole update's time, part of it hidden behind the rollout).
"""

from __future__ import annotations

import time

from hybridrl.protocol import DataProto
from hybridrl.seeding import step_sampling_seed
from hybridrl.trainer.rollout_batch import (
    assign_uids,
    attach_rollout,
    generation_inputs,
    own_log_prob_metrics,
)
from hybridrl.trainer.timer import marked_timer

PARTS_PER_STEP = 8   # the rollout's finished groups are scored and trained in about this many parts (and the rest)


def early_update_step(trainer, batch: DataProto, metrics: dict, timing: dict, absorb) -> DataProto:
    """Generate, score and train `batch` with the update running beside the rollout; returns the batch as
    trained on (its groups in the order they finished)."""
    cfg, wg = trainer.config, trainer.actor_rollout_wg
    n = cfg.actor_rollout_ref.rollout.n
    assign_uids(batch)
    gen = generation_inputs(batch)
    gen.meta_info = {**trainer._meta(), "seed": step_sampling_seed(cfg.trainer.seed, cfg.actor_rollout_ref.rollout.seed,
                                                                   trainer.global_steps)}
    rows = len(batch) * n
    wg.begin_early_update(rows)
    start = time.perf_counter()
    wg.start_rollout_stream(gen)
    parts, reward_metrics = [], []
    trained_early, gen_end = 0, None
    while gen_end is None:
        taken = [o for o in wg.take_rollout_stream(max(n, rows // PARTS_PER_STEP)) if o is not None]
        ended = [o.meta_info.pop("done") for o in taken]
        if all(ended):
            gen_end = time.perf_counter() - max(o.meta_info.pop("seconds_since_end") for o in taken)
            timing["gen"] = gen_end - start
        for o in taken:
            absorb(o)
            o.meta_info.pop("seconds_since_end", None)
        taken = [o for o in taken if len(o)]
        if not taken:
            continue
        part = _score(trainer, attach_rollout(batch, DataProto.concat(taken), n, by_uid=True), metrics, timing,
                      absorb, reward_metrics)
        with marked_timer("update_actor", timing):
            out = wg.accumulate_actor(part)
            absorb(out)
        if "old_log_probs" in out.batch:   # the update's own, for the rollout-vs-trainer metrics below
            part.batch["old_log_probs"] = out.batch["old_log_probs"]
        trained_early += len(part) if out.meta_info.get("during_rollout") else 0
        parts.append(part)
    trainer._check_rewards(reward_metrics, metrics)   # before the optimizer step uses the scores
    with marked_timer("update_actor", timing):
        for out in wg.finish_early_update():
            absorb(out)
    timing["update_after_gen"] = time.perf_counter() - gen_end
    metrics["actor/early_update_frac"] = trained_early / rows
    batch = DataProto.concat(parts)
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
    if "old_log_probs" in batch.batch:
        metrics.update(own_log_prob_metrics(batch, batch.batch["old_log_probs"], trainer.rollout_correction))
    return batch


def _score(trainer, part: DataProto, metrics: dict, timing: dict, absorb, reward_metrics: list) -> DataProto:
    """Rewards, the reference's log-probs (KL loss; the plan runs no old-log-prob pass here) and the advantages of
    finished groups, through the trainer's own phases."""
    reward_metrics.append(trainer._score(part, metrics, timing, absorb).get("metrics", {}))
    part.batch["token_level_rewards"] = part.batch["token_level_scores"]
    part = trainer._old_and_ref_log_probs(part, timing, absorb)
    return trainer._advantages(part, metrics, timing)
