"""The critic's part of the run plan (PPO with GAE): the micro-batches of its update and values passes (rows or
token budgets), its forwards' packing and prompt sharing, and — once every other phase's peak is known — its
gradient checkpointing (`plan_critic_recompute`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridrl.plan.actor_plan import ActorPlan, resolve_checkpointing
from hybridrl.plan.memory import MemoryModel
from hybridrl.plan.rollout_plan import KvCachePlan
from hybridrl.plan.sizing import (
    LOGPROB_TOKENS_TARGET,
    MicroBatching,
    Sizing,
    divisors_desc,
    is_auto,
    resolve_remove_padding,
)


@dataclass(frozen=True)
class CriticPlan:
    update: MicroBatching               # per GPU; the update's rows divide its per-GPU mini-batch
    values: MicroBatching               # the no-grad values pass
    gradient_checkpointing: bool
    recompute_kept_layers: int          # with checkpointing: its last decoder layers not recomputed
    share_prompts: bool                 # the actor's choice, without critic Ulysses
    remove_padding: bool

    def describe(self) -> str:
        """The critic's line of `hybridrl config check`."""
        return f"critic          micro-batch per GPU: update {self.update}, values {self.values}"


def plan_critic(sizing: Sizing, kv_cache: KvCachePlan, actor: ActorPlan) -> CriticPlan:
    """The critic's passes, each the largest micro-batch (or token budget) that fits next to `kv_cache`; predicts
    the values and update_critic phases. Checkpointing is planned on (`plan_critic_recompute` settles it)."""
    get, layout, memory, predicted = sizing.get, sizing.layout, sizing.memory, sizing.predicted
    seq_len, kv_bytes = sizing.seq_len, kv_cache.bytes
    unshard_once = sizing.unshard("critic.forward_unshard_once", sizing.shape)
    # the critic shares prompts with the actor's choice, unless its own Ulysses SP splits the packed row
    share_prompts = actor.share_prompts and layout.parallel.critic_sp == 1
    tokens_of = sizing.micro_tokens(share_prompts)

    def update_peak(rows, tokens=seq_len, row_tokens=None):
        return memory.critic_phase("update_critic", rows, tokens, False, kv_bytes, row_tokens)

    def values_peak(rows, tokens=seq_len, row_tokens=None):
        return memory.critic_phase("values", rows, tokens, unshard_once, kv_bytes, row_tokens)

    dynamic = sizing.dynamic("critic.use_dynamic_bsz", "critic.ppo_micro_batch_size_per_gpu")
    if dynamic:  # the values pass: its own key, else the update's budget where set (verl), else the log-prob target
        key, values_key = "critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"
        per_gpu_seq = -(-seq_len // layout.parallel.critic_sp)   # per-GPU budgets (verl's), as the actor's
        update_tokens = sizing.pick_tokens(key, sizing.update_tokens_target, lambda t: update_peak(1, t),
                                           longest=per_gpu_seq)
        if is_auto(sizing.get(values_key)) and not is_auto(sizing.get(key)):
            values_key = key
        values_tokens = sizing.pick_tokens(values_key, LOGPROB_TOKENS_TARGET, lambda t: values_peak(1, t),
                                           longest=per_gpu_seq)
        predicted["values"] = values_peak(1, values_tokens)
        predicted["update_critic"] = update_peak(1, update_tokens)
        update = MicroBatching(max_tokens=update_tokens)
        values = MicroBatching(max_tokens=values_tokens, unshard_once=unshard_once)
    else:
        update_rows = sizing.pick("critic.ppo_micro_batch_size_per_gpu",
                                  divisors_desc(layout.critic_mini_batch_per_gpu), sizing.update_tokens_target,
                                  lambda m: update_peak(m, row_tokens=tokens_of(m)), tokens=tokens_of)
        values_rows = sizing.pick("critic.forward_micro_batch_size_per_gpu",
                                  list(range(layout.samples_per_train_rank, 0, -1)),
                                  LOGPROB_TOKENS_TARGET, lambda m: values_peak(m, row_tokens=tokens_of(m)),
                                  tokens=tokens_of)
        predicted["values"] = values_peak(values_rows, row_tokens=tokens_of(values_rows))
        predicted["update_critic"] = update_peak(update_rows, row_tokens=tokens_of(update_rows))
        update = MicroBatching(rows=update_rows)
        values = MicroBatching(rows=values_rows, unshard_once=unshard_once)
    return CriticPlan(update=update, values=values,
                      gradient_checkpointing=sizing.residency.critic_gradient_checkpointing, recompute_kept_layers=0,
                      share_prompts=share_prompts,
                      remove_padding=resolve_remove_padding(get("critic.model.use_remove_padding"), dynamic,
                                                            layout.parallel.critic_sp))


def plan_critic_recompute(sizing: Sizing, kv_cache: KvCachePlan, critic: CriticPlan) -> CriticPlan:
    """The critic's gradient checkpointing 'auto' settled against every other phase's predicted peak."""
    key = "critic.model.enable_gradient_checkpointing"
    if not is_auto(sizing.get(key)):
        return critic
    tokens_of = None if critic.update.rows is None else sizing.micro_tokens(critic.share_prompts)

    def peak(rows, tokens, kept=None):
        residency = replace(sizing.residency, critic_gradient_checkpointing=kept is not None,
                            critic_kept_layers=kept or 0)
        return MemoryModel(sizing.shape, residency).critic_phase("update_critic", rows, tokens, False,
                                                                 kv_cache.bytes, tokens_of and tokens_of(rows))

    on, kept = resolve_checkpointing(key, sizing.residency.critic_activation_offload, sizing, critic.update, peak,
                                     "update_critic")
    return replace(critic, gradient_checkpointing=on, recompute_kept_layers=kept)
