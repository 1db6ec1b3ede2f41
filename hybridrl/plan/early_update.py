"""Whether the actor's update starts on finished prompt groups while the rollout's other groups still decode
(`actor.early_update`; trainer/early_update.py runs it). It is exactly the update of the whole batch only where
each group's part of it can be computed from that group alone and the optimizer steps once after the last group:

- one on-policy mini-batch and epoch, so no old-log-prob pass (the update's own log-probs are the old ones);
- advantages from each group's own rewards (GROUP_ESTIMATORS): no critic, no batch-wide whitening, no greedy
  baseline rollout;
- no step that decides on the whole batch before any update: dynamic sampling (filter_groups), partial rollouts;
- the native engine, generating on its own (no multi-turn agent, no reward-model worker on the GPUs meanwhile),
  with the actor's parameters on the GPU (no param_offload);
- one training rank: FSDP on several ranks reduces gradients in every backward, before the whole batch's
  normaliser is known;
- a policy loss and its regularisers aggregated alike (the gradient is put on the true normaliser once, at the end).

On a GPU it also has to fit: the rollout's memory and the update's activations and gradients at once, which then
is the predicted peak of the rollout phase (`gen`), within CONCURRENT_SAFETY of the GPU: the two phases allocate
in turns, and on an H200 a run predicted within 90% ran out of memory with 117 GiB allocated and 20 GiB reserved
but unallocated between them. With `true`, the update's recompute is planned to fit beside the rollout
(`update_fits_beside_rollout`).
"""

from __future__ import annotations

from dataclasses import replace

from hybridrl.algorithms import get_policy_loss_fn
from hybridrl.config.errors import ConfigError
from hybridrl.plan.actor_plan import ACTOR, ActorPlan
from hybridrl.plan.memory import GiB, PhaseMemory
from hybridrl.plan.rollout_plan import ROLLOUT
from hybridrl.plan.sizing import MODEL, Sizing, is_auto

KEY = f"{ACTOR}.early_update"
CONCURRENT_SAFETY = 0.75   # of a GPU's memory for the rollout and the update at once (fragmentation: see above)
GROUP_ESTIMATORS = ("grpo", "rloo")   # advantages computed from a prompt group's own rewards alone


def why_not_exact(sizing: Sizing, actor: ActorPlan) -> str | None:
    """The first reason the early update would not be the whole batch's update, or None."""
    get = sizing.get
    estimator = str(getattr(get("algorithm.adv_estimator"), "value", get("algorithm.adv_estimator")))
    mode = get(f"{ACTOR}.loss_agg_mode")
    pg_mode = getattr(get_policy_loss_fn(get(f"{ACTOR}.policy_loss.loss_mode")), "loss_agg_mode", mode)
    regularised = (get(f"{ACTOR}.entropy_coeff") != 0 or get(f"{ACTOR}.use_kl_loss")
                   or get(f"{ACTOR}.router_aux_loss_coef") or get(f"{ACTOR}.router_z_loss_coef"))
    checks = [
        (actor.old_log_prob_pass, "the update is not one on-policy mini-batch (it runs an old-log-prob pass)"),
        (estimator not in GROUP_ESTIMATORS, f"algorithm.adv_estimator={estimator!r} does not take advantages from "
                                            f"each group alone (those that do: {', '.join(GROUP_ESTIMATORS)})"),
        (get("algorithm.filter_groups.enable"), "dynamic sampling (algorithm.filter_groups) chooses the batch first"),
        (get(f"{ROLLOUT}.partial_rollout.enable"), "partial rollouts choose the trained groups after the rollout"),
        (get(f"{ROLLOUT}.multi_turn.enable"), "a multi-turn agent can add samples to a group"),
        (get("reward_model.enable"), "a reward model scores on the GPUs during the rollout"),
        (get("reward_model.launch_reward_fn_async"), "reward_model.launch_reward_fn_async scores the whole batch "
                                                     "beside the passes after the rollout"),
        (get(f"{ROLLOUT}.name") != "native", f"{ROLLOUT}.name={get(f'{ROLLOUT}.name')!r}: only the native engine "
                                             "reports finished groups"),
        (get(f"{ACTOR}.fsdp_config.param_offload"), "param_offload moves the actor's parameters off the GPU during "
                                                    "the rollout"),
        (sizing.layout.parallel.world_size > 1, f"{sizing.layout.parallel.world_size} ranks: FSDP reduces gradients "
                                                "in each backward, before the batch's normaliser is known"),
        (pg_mode != mode and regularised, f"the policy loss aggregates with {pg_mode!r} and its regularisers with "
                                          f"{mode!r}"),
    ]
    return next((why for failed, why in checks if failed), None)


def concurrent_memory(gen: PhaseMemory, update: PhaseMemory) -> PhaseMemory:
    """The rollout and the update's micro-batches at once: what both hold counted once, the rest of each added
    (the optimizer step comes after the rollout)."""
    names = (set(gen.parts) | set(update.parts)) - {"optimizer step"}
    return PhaseMemory("gen", {k: max(gen.parts.get(k, 0), update.parts.get(k, 0)) for k in names})


def concurrent_budget(sizing: Sizing) -> float:
    return CONCURRENT_SAFETY * sizing.device.total_bytes


def update_fits_beside_rollout(sizing: Sizing, actor: ActorPlan):
    """With `early_update: true` where it is exact, on a GPU: (fits, words) for the update's recompute planning
    (actor_plan.plan_actor_recompute) such that the update fits beside the rollout's predicted `gen` memory; else
    None (the update is planned against the device budget)."""
    if sizing.get(KEY) is not True or sizing.budget is None or why_not_exact(sizing, actor) is not None:
        return None
    gen, budget = sizing.predicted["gen"], concurrent_budget(sizing)
    words = (f"{CONCURRENT_SAFETY:.0%} of {sizing.device.total_bytes / GiB:.1f} GiB beside the rollout's "
             f"{gen.total / GiB:.1f} GiB ({KEY} = true)")
    return (lambda update: concurrent_memory(gen, update).total <= budget), words


def plan_early_update(sizing: Sizing, actor: ActorPlan) -> ActorPlan:
    """`actor.early_update`: auto is on on a GPU where `why_not_exact` finds nothing and the concurrent peak fits
    the budget (it then replaces the predicted `gen` peak); true is refused where either fails; false is off."""
    value, choices = sizing.get(KEY), sizing.choices
    if value is False:
        return actor
    if is_auto(value) and sizing.budget is None:
        choices.append(f"{KEY} = false (the CPU: the rollout and the update would share its cores)")
        return actor
    why = why_not_exact(sizing, actor)
    if why is not None:
        if value is True:
            raise ConfigError([f"'{KEY}' = true: {why}, so an early update would not be the same update; set it to "
                               "auto or false"])
        choices.append(f"{KEY} = false ({why})")
        return actor
    if sizing.budget is not None:
        both = concurrent_memory(sizing.predicted["gen"], sizing.predicted["update_actor"])
        if both.total > concurrent_budget(sizing):
            message = (f"the rollout and the update at once are predicted at {both.total / GiB:.1f} GiB, over "
                       f"{CONCURRENT_SAFETY:.0%} of {sizing.device.total_bytes / GiB:.1f} GiB")
            if value is True:
                raise ConfigError([f"'{KEY}' = true: {message}; set it to auto or false, or lower "
                                   f"{ROLLOUT}.gpu_memory_utilization or the update's micro-batch "
                                   f"({MODEL}.enable_gradient_checkpointing)"])
            choices.append(f"{KEY} = false ({message})")
            return actor
        before = max(p.total for p in sizing.predicted.values())
        sizing.predicted["gen"] = both
        if is_auto(value):   # the plan's choices are its own, not what the config set
            choices.append(f"{KEY} = true (finished groups train beside the decode tail: the rollout and the update "
                           f"at once are predicted at {both.total / GiB:.1f} GiB, the run's peak "
                           f"{before / GiB:.1f} GiB without it; false keeps that)")
    return replace(actor, early_update=True)
