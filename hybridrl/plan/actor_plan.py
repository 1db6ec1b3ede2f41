"""The actor's part of the run plan (with its reference's): the micro-batches of its update, old log-prob and
reference log-prob passes (rows or token budgets), whether the old log-prob pass runs, its forwards' packing and
prompt sharing, and — once every other phase's peak is known — its gradient checkpointing (`plan_actor_recompute`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridrl.config.errors import ConfigError
from hybridrl.plan.memory import GiB, MemoryModel
from hybridrl.plan.rollout_plan import ROLLOUT, KvCachePlan
from hybridrl.plan.sizing import (
    LOGPROB_TOKENS_TARGET,
    MODEL,
    MicroBatching,
    Sizing,
    divisors_desc,
    is_auto,
    resolve_remove_padding,
)

ACTOR, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"


@dataclass(frozen=True)
class ActorPlan:
    update: MicroBatching               # per GPU; the update's rows divide its per-GPU mini-batch
    old_log_prob: MicroBatching         # rows and max_tokens None without the pass
    ref_log_prob: MicroBatching         # rows and max_tokens None without a reference
    old_log_prob_pass: bool             # false: the update's own detached log-probs are the old ones (on-policy)
    gradient_checkpointing: bool        # the update recomputes each layer in backward
    recompute_kept_layers: int          # with checkpointing: its last decoder layers that keep their activations
                                        # (not recomputed); 0 = all recompute
    activation_offload: bool            # model.enable_activation_offload resolved: the update's checkpointed layer
                                        # inputs wait in host memory (with checkpointing only)
    optimizer_offload: bool             # actor.fsdp_config.optimizer_offload resolved: the hybrid engine moves the
                                        # AdamW state to host memory from the rollout until the update's first
                                        # optimizer step
    share_prompts: bool                 # actor.use_prefix_grouper: the actor's and reference's forwards run each
                                        # prompt of a micro-batch once (training/packing.py)
    remove_padding: bool                # the actor's and reference's forwards packed (varlen attention)
    use_liger: bool                     # Liger's fused kernels in the actor's / reference's training graph
    lora_base_dtype: str | None         # LoRA: the frozen base weights, the frozen dtype unless model_dtype is
                                        # narrower (adapters stay in model_dtype); None: no LoRA
    early_update: bool = False          # the update trains finished groups while the rollout goes on
                                        # (early_update.py)

    def describe(self) -> str:
        """The actor's line of `hybridrl config check`."""
        old = str(self.old_log_prob) if self.old_log_prob_pass else "none (on-policy)"
        return (f"micro-batches   per GPU: update {self.update}, old log-prob {old}, reference {self.ref_log_prob}"
                f"{', packed' if self.remove_padding or self.share_prompts else ', padded'}"
                f"{'; the update starts on finished groups during the rollout' if self.early_update else ''}")


def plan_actor(sizing: Sizing, kv_cache: KvCachePlan, share_prompts: bool, lora_base_dtype: str | None) -> ActorPlan:
    """The actor's passes, each the largest micro-batch (or token budget) that fits next to `kv_cache`; predicts
    the update_actor, old_log_prob and ref phases. Checkpointing is planned on (`plan_actor_recompute` settles it)."""
    get, layout, memory, predicted = sizing.get, sizing.layout, sizing.memory, sizing.predicted
    seq_len, response_len, kv_bytes = sizing.seq_len, sizing.response_len, kv_cache.bytes
    tokens_of = sizing.micro_tokens(share_prompts)
    log_prob_candidates = list(range(layout.samples_per_train_rank, 0, -1))
    # token budgets are per GPU (verl's): with Ulysses a micro-batch holds budget x sp tokens, 1/sp of them per GPU
    per_gpu_seq = -(-seq_len // layout.ulysses_sp)

    update_key = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    if not sizing.dynamic(f"{ACTOR}.use_dynamic_bsz", update_key):
        rows = sizing.pick(update_key, divisors_desc(layout.ppo_mini_batch_per_gpu), sizing.update_tokens_target,
                           lambda m: memory.update_actor(m, seq_len, response_len, kv_bytes, tokens_of(m)),
                           tokens=tokens_of)
        update = MicroBatching(rows=rows)
        predicted["update_actor"] = memory.update_actor(rows, seq_len, response_len, kv_bytes, tokens_of(rows))
    else:
        tokens = sizing.pick_tokens(f"{ACTOR}.ppo_max_token_len_per_gpu", sizing.update_tokens_target,
                                    lambda t: memory.update_actor(1, t, response_len, kv_bytes), longest=per_gpu_seq)
        update = MicroBatching(max_tokens=tokens)
        predicted["update_actor"] = memory.update_actor(1, tokens, response_len, kv_bytes)

    old_pass = _resolve_old_log_prob_pass(sizing)

    def log_prob_pass(phase: str, section: str, unshard_once: bool) -> MicroBatching:
        if sizing.dynamic(f"{section}.log_prob_use_dynamic_bsz", f"{section}.log_prob_micro_batch_size_per_gpu"):
            tokens = sizing.pick_tokens(f"{section}.log_prob_max_token_len_per_gpu", LOGPROB_TOKENS_TARGET,
                                        lambda t: memory.log_prob(phase, 1, t, response_len, unshard_once, kv_bytes),
                                        longest=per_gpu_seq)
            predicted[phase] = memory.log_prob(phase, 1, tokens, response_len, unshard_once, kv_bytes)
            return MicroBatching(max_tokens=tokens, unshard_once=unshard_once)
        rows = sizing.pick(f"{section}.log_prob_micro_batch_size_per_gpu", log_prob_candidates, LOGPROB_TOKENS_TARGET,
                           lambda m: memory.log_prob(phase, m, seq_len, response_len, unshard_once, kv_bytes,
                                                     tokens_of(m)), tokens=tokens_of)
        predicted[phase] = memory.log_prob(phase, rows, seq_len, response_len, unshard_once, kv_bytes, tokens_of(rows))
        return MicroBatching(rows=rows, unshard_once=unshard_once)

    old_once = sizing.unshard(f"{ROLLOUT}.log_prob_unshard_once", sizing.shape)
    ref_once = sizing.unshard(f"{REF}.log_prob_unshard_once", sizing.shape)
    old_log_prob = log_prob_pass("old_log_prob", ROLLOUT, old_once) if old_pass else MicroBatching(
        unshard_once=old_once)
    ref_log_prob = log_prob_pass("ref", REF, ref_once) if sizing.residency.has_ref else MicroBatching(
        unshard_once=ref_once)
    packed_by_tokens = update.rows is None or old_log_prob.max_tokens is not None or ref_log_prob.max_tokens is not None
    return ActorPlan(update=update, old_log_prob=old_log_prob, ref_log_prob=ref_log_prob, old_log_prob_pass=old_pass,
                     gradient_checkpointing=sizing.residency.gradient_checkpointing, recompute_kept_layers=0,
                     activation_offload=sizing.residency.activation_offload,
                     optimizer_offload=sizing.residency.optimizer_offload, share_prompts=share_prompts,
                     remove_padding=resolve_remove_padding(get(f"{MODEL}.use_remove_padding"), packed_by_tokens,
                                                           layout.ulysses_sp),
                     use_liger=sizing.residency.liger, lora_base_dtype=lora_base_dtype)


def _resolve_old_log_prob_pass(sizing: Sizing) -> bool:
    """`actor.old_log_prob_pass`: auto runs it unless the update is one on-policy mini-batch whose whole-batch
    corrections do not need the old log-probs first, or the bypass mode takes the rollout's; false is refused where
    they are needed."""
    get, layout = sizing.get, sizing.layout
    if get("algorithm.rollout_correction.bypass_mode"):   # the config refuses old_log_prob_pass=true beside it
        sizing.choices.append(f"{ACTOR}.old_log_prob_pass = false (algorithm.rollout_correction.bypass_mode: the "
                              "rollout's log-probs are the old ones)")
        return False
    on_policy = (get(f"{ACTOR}.ppo_epochs") == 1 and layout.num_mini_batches == 1
                 and not get("algorithm.use_kl_in_reward"))
    old_pass = get(f"{ACTOR}.old_log_prob_pass")
    if old_pass is False and not on_policy:
        raise ConfigError([f"'{ACTOR}.old_log_prob_pass' = false needs an on-policy update (ppo_epochs 1, "
                           "ppo_mini_batch_size = train_batch_size, algorithm.use_kl_in_reward false)"])
    # rejection and batch-normalised IS weights change the whole batch's mask / weights before any update
    # micro-batch runs: they need the old log-probs first (plain token/sequence weights are made per micro-batch)
    correction = "algorithm.rollout_correction"
    # Σπ² comes from the old-log-prob pass alone (the config refuses old_log_prob_pass=false beside it)
    whole_batch = [k for k in (f"{correction}.rollout_rs", f"{correction}.rollout_is_batch_normalize",
                               f"{ACTOR}.calculate_sum_pi_squared") if get(k)]
    if old_pass is False and whole_batch:
        raise ConfigError([f"'{ACTOR}.old_log_prob_pass' = false cannot go with '{whole_batch[0]}' = "
                           f"{get(whole_batch[0])}: it needs the old log-probs of the whole batch before the update "
                           "(set it to auto or true)"])
    old_pass = (not on_policy or bool(whole_batch)) if is_auto(old_pass) else bool(old_pass)
    if not old_pass:
        sizing.choices.append(f"{ACTOR}.old_log_prob_pass = false (one on-policy mini-batch: the update's log-probs, "
                              "detached, are the old ones)")
    return old_pass


def plan_actor_recompute(sizing: Sizing, kv_cache: KvCachePlan, actor: ActorPlan, fits=None,
                         within: str | None = None) -> ActorPlan:
    """The actor update's memory-for-time choices, settled once every other phase is planned: gradient
    checkpointing 'auto', then its weights gathered once per mini-batch (`plan_update_unshard`). `fits(update
    memory) -> bool` and its words `within` replace the device budget (the early update trains beside the
    rollout: early_update.py)."""
    key = f"{MODEL}.enable_gradient_checkpointing"
    tokens_of = None if actor.update.rows is None else sizing.micro_tokens(actor.share_prompts)

    def peak(rows, tokens, kept=None, once=False):
        residency = replace(sizing.residency, gradient_checkpointing=kept is not None, kept_layers=kept or 0,
                            update_unshard_once=once)
        return MemoryModel(sizing.shape, residency).update_actor(rows, tokens, sizing.response_len, kv_cache.bytes,
                                                                 tokens_of and tokens_of(rows))

    if is_auto(sizing.get(key)):
        on, kept = resolve_checkpointing(key, sizing.residency.activation_offload, sizing, actor.update, peak,
                                         "update_actor", fits, within)
        actor = replace(actor, gradient_checkpointing=on, recompute_kept_layers=kept)
    return plan_update_unshard(sizing, actor, peak, fits, within)


def plan_update_unshard(sizing: Sizing, actor: ActorPlan, peak, fits=None, within: str | None = None) -> ActorPlan:
    """Whether the update keeps every block unsharded for a whole mini-batch: one all-gather per block per
    mini-batch instead of two per micro-batch (fewer copies and less host work: 2.6% of a 1.5B update with
    16k-token micro-batches, benchmarks/results/long_tail), for the model's compute-dtype copy. Considered where
    log-prob passes would unshard once too (`Sizing.auto_unshard`); chosen where it fits within the device budget,
    or in place of one layer that checkpointing let keep its activations (on that 1.5B update one kept layer saved
    0.8%); never where it would take more. Off on a CPU.
    `actor.update_unshard_once` true / false overrides the choice (true is refused where it exceeds the device).
    `peak(rows, tokens, kept, once)`, `fits`, `within`: as in `resolve_checkpointing`."""
    key = f"{ACTOR}.update_unshard_once"
    value = sizing.get(key)
    update, on, kept = actor.update, actor.gradient_checkpointing, actor.recompute_kept_layers
    rows, tokens = (1, update.max_tokens) if update.rows is None else (update.rows, sizing.seq_len)
    if value is True:
        once = peak(rows, tokens, kept if on else None, once=True)
        if sizing.budget is not None and once.total > sizing.budget:
            raise ConfigError([sizing.over(key, value, once) + "set it to auto or false"])
        if sizing.budget is not None:
            sizing.predicted["update_actor"] = once
        return replace(actor, update=replace(update, unshard_once=True))
    if value is False or sizing.budget is None or not sizing.auto_unshard(sizing.shape):
        return actor
    fits, within = fits or sizing.fits_budget, within or sizing.budget_words
    extra = f"+{sizing.shape.num_params * 2 / GiB:.1f} GiB unsharded"
    for k in (kept, kept - 1) if on and kept else (kept,):
        once = peak(rows, tokens, k if on else None, once=True)
        if fits(once):
            sizing.predicted["update_actor"] = once
            fewer = f", one kept layer fewer: {sizing.shape.layers - k} of {sizing.shape.layers} recompute" \
                if k < kept else ""
            sizing.choices.append(f"{key} = true (weights gathered once per mini-batch, {extra}{fewer}: "
                                  f"predicted update_actor peak {once.total / GiB:.1f} GiB, within {within})")
            return replace(actor, recompute_kept_layers=k, update=replace(update, unshard_once=True))
    sizing.choices.append(f"{key} = false (gathered once per mini-batch, {extra}, the update would peak over "
                          f"{within})")
    return actor


def resolve_checkpointing(key: str, offload: bool, sizing: Sizing, update: MicroBatching, peak, phase: str,
                          fits=None, within: str | None = None) -> tuple[bool, int]:
    """Gradient checkpointing 'auto' -> (checkpointing, kept_layers). Off (backward without recomputing each
    layer's forward: one forward fewer per micro-batch) where the micro-batch chosen with it — or the token
    budget — also fits without it within the device budget (SAFETY of the GPU's memory). Else on, but with as many
    of the last decoder layers as fit keeping their activations (each one kept saves its share of the recompute).
    Time first, within the device: memory the run would leave unused buys no speed (the 1.5B long-tail update, 32k-
    token micro-batches: 5.65 s without recompute at a 94 GiB peak, 6.80 s with half the layers recomputed at 16k
    and 45 GiB; benchmarks/results/long_tail/update_ops.json); `enable_gradient_checkpointing: true` keeps the lean
    choice. It never shrinks the micro-batch to fit: on a 7B LoRA update, 128 micro-batches of 2048 tokens without
    recompute took 1.54x the time of 16 of 16384 with it (docs/benchmarks.md). On a CPU (no memory model) it is
    off. Updates `sizing.predicted[phase]` unless fully on.
    `peak(rows, tokens, kept)`: the phase's memory with `kept` layers not recomputed, without checkpointing for
    kept=None; `fits(phase memory) -> bool` (default: within the device budget) and its words `within`."""
    choices, predicted, layers = sizing.choices, sizing.predicted, sizing.shape.layers
    if offload:
        choices.append(f"{key} = true (activation offload moves the inputs checkpointing keeps)")
        return True, 0
    if sizing.budget is None:
        choices.append(f"{key} = false (no device memory to plan against: recompute would only cost time)")
        return False, 0
    fits, within = fits or sizing.fits_budget, within or sizing.budget_words
    rows, tokens = (1, update.max_tokens) if update.rows is None else (update.rows, sizing.seq_len)
    without = peak(rows, tokens)
    if fits(without):
        predicted[phase] = without
        choices.append(f"{key} = false (no recompute: predicted {phase} peak {without.total / GiB:.1f} GiB, within "
                       f"{within})")
        return False, 0
    kept = next((k for k in range(layers - 1, 0, -1) if fits(peak(rows, tokens, k))), 0)
    if kept:
        predicted[phase] = peak(rows, tokens, kept)
        choices.append(f"{key} = true for the first {layers - kept} of {layers} decoder layers (the last {kept} keep "
                       f"their activations: predicted {phase} peak {predicted[phase].total / GiB:.1f} GiB, within "
                       f"{within}; without recompute {without.total / GiB:.1f} GiB)")
        return True, kept
    choices.append(f"{key} = true (without it the {phase} micro-batch would peak at {without.total / GiB:.1f} "
                   f"GiB, over {within})")
    return True, 0


def resolve_prefix_grouper(value, device_type: str, n: int, sp: int, choices: list[str],
                           key: str = f"{ACTOR}.use_prefix_grouper") -> bool:
    """`use_prefix_grouper`: true needs no Ulysses SP (its attention splits one packed row by position) and is
    refused with it; auto is on on GPUs when a prompt has several samples (rollout.n > 1) and true would be
    accepted, and off on the CPU (runs there check correctness; the padded path is the reference)."""
    if value not in ("auto", True, False) or isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError([f"'{key}' = {value!r}: must be auto, true or false"])
    if value is False:
        return False
    if sp > 1:
        if value is True:
            raise ConfigError([f"'{key}' = true does not go with actor_rollout_ref.actor.ulysses_sequence_parallel_"
                               f"size = {sp} (Ulysses splits the packed row by position); set one of them to "
                               "false / 1"])
        choices.append(f"{key} = false (Ulysses sequence parallelism, sp = {sp})")
        return False
    if value is True:
        return True
    why_not = ("rollout.n = 1: no prompt has two samples" if n == 1
               else "the CPU: the padded path" if device_type == "cpu" else None)
    choices.append(f"{key} = " + (f"false ({why_not})" if why_not else
                                  f"true (each prompt once per micro-batch for its {n} samples)"))
    return why_not is None


def resolve_liger(value, device_type: str, model_type: str | None, choices: list[str],
                  key: str = f"{MODEL}.use_liger") -> bool:
    """`use_liger` (`key`): true needs a GPU, the liger-kernel package and an architecture it patches (else a
    ConfigError naming what is missing); auto is on exactly where true would be accepted, and says why in
    `choices`; false is off."""
    from hybridrl.training.liger import LIGER_ARCHITECTURES, liger_installed

    if value not in ("auto", True, False) or isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError([f"'{key}' = {value!r}: must be auto, true or false"])
    if value is False:
        return False
    missing = ("the device is the CPU: Liger's kernels are Triton GPU kernels" if device_type == "cpu"
               else "the liger-kernel package is not installed: pip install 'hybridrl[gpu]'" if not liger_installed()
               else f"model_type {model_type!r} has no Liger kernels here (supported: {', '.join(LIGER_ARCHITECTURES)})"
               if model_type not in LIGER_ARCHITECTURES else None)
    if value is True:
        if missing:
            raise ConfigError([f"'{key}' = true: {missing}; set it to false or auto"])
        return True
    choices.append(f"{key} = {'false (' + missing + ')' if missing else 'true (fused RMSNorm, SwiGLU, RoPE)'}")
    return missing is None
