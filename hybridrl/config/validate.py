"""Config validation, run at load time before any worker starts.

Two passes, both collecting every problem before raising one `ConfigError` (a `ValueError`), so a user
fixes a YAML in one round trip:
- `schema.check_schema`: unknown keys (named with the closest known key), types and allowed values (the
  annotations of the section dataclasses).
- `check_semantics` (PPO config only): positive sizes, batch arithmetic with the actual numbers, device
  mesh divisibility, ranges. Critic keys are checked only when `algorithm.adv_estimator == gae`, as the
  critic does not exist otherwise.
Things verl allows but that are usually a mistake (KL in the loss *and* in the reward, GRPO with n=1)
are returned as warnings, not errors. Ints are accepted where a float is expected (YAML `1` for `1.0`).
"""

from __future__ import annotations

from functools import partial

from omegaconf import DictConfig, OmegaConf

from hybridrl.config.errors import ConfigError
from hybridrl.config.limits import check_limits
from hybridrl.config.reward_rules import reward_model_errors
from hybridrl.config.schema import check_schema
from hybridrl.config.sections import ROOTS
from hybridrl.dotted import dotted_get
from hybridrl.models.tp_rules import model_tp_error
from hybridrl.tools.sandbox import parse_required_layers

__all__ = ["check_semantics", "validate_config"]

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"


def _plain(cfg: DictConfig | dict) -> dict:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def check_semantics(cfg: DictConfig | dict) -> list[str]:
    """PPO/GRPO rules between keys. Raises ConfigError; returns warnings (strings)."""
    c = _plain(cfg)
    g = partial(dotted_get, c)
    errors: list[str] = []
    warnings: list[str] = []

    positive = ["data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
                "trainer.nnodes", "trainer.n_gpus_per_node", "trainer.total_epochs",
                f"{ACTOR}.ppo_mini_batch_size", f"{ACTOR}.ppo_epochs", f"{ACTOR}.ulysses_sequence_parallel_size",
                f"{ROLLOUT}.n", f"{ROLLOUT}.tensor_model_parallel_size",
                f"{ROLLOUT}.block_size", f"{ROLLOUT}.max_num_seqs", f"{ROLLOUT}.max_num_batched_tokens",
                f"{ROLLOUT}.val_kwargs.n", "critic.ulysses_sequence_parallel_size",
                f"{ACTOR}.optim.lr", "reward_model.error_window_steps"]
    positive_or_null = ["data.val_batch_size", "trainer.total_training_steps", f"{ACTOR}.ppo_micro_batch_size_per_gpu",
                        f"{ACTOR}.ppo_max_token_len_per_gpu", f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
                        f"{REF}.log_prob_max_token_len_per_gpu",
                        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", f"{REF}.log_prob_micro_batch_size_per_gpu",
                        f"{ACTOR}.ppo_micro_batch_size", f"{ROLLOUT}.log_prob_micro_batch_size",
                        f"{REF}.log_prob_micro_batch_size"]
    adv = g("algorithm.adv_estimator")
    if adv == "gae":
        positive += ["critic.ppo_mini_batch_size", "critic.ppo_epochs", "critic.optim.lr"]
        positive_or_null += ["critic.ppo_max_token_len_per_gpu", "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
                             "critic.ppo_micro_batch_size"]
    for p in positive:
        if g(p) <= 0:
            errors.append(f"'{p}' must be > 0, got {g(p)}")
    for p in positive_or_null:
        if isinstance(g(p), str):  # micro-batch sizes and token budgets take 'auto' (the run plan chooses)
            if g(p) != "auto":
                errors.append(f"'{p}' must be 'auto', a positive integer or null, got {g(p)!r}")
        elif g(p) is not None and g(p) <= 0:
            errors.append(f"'{p}' must be > 0 or null, got {g(p)}")
    if errors:  # the arithmetic below divides by these
        raise ConfigError(errors)

    try:
        from hybridrl.models.tokenizer import resolve_chat_template

        resolve_chat_template(g("actor_rollout_ref.model.custom_chat_template"))
    except ValueError as e:
        errors.append(str(e))
    for model_sec in ("actor_rollout_ref.model", "critic.model"):
        if g(f"{model_sec}.enable_activation_offload") and not g(f"{model_sec}.enable_gradient_checkpointing"):
            errors.append(f"'{model_sec}.enable_activation_offload' = true needs '{model_sec}."
                          "enable_gradient_checkpointing' = true or auto (it offloads the inputs checkpointing keeps)")
    for key in ("router_aux_loss_coef", "router_z_loss_coef"):
        if g(f"actor_rollout_ref.actor.{key}") < 0:
            errors.append(f"'actor_rollout_ref.actor.{key}' must be >= 0 (0 = off), got {g(f'actor_rollout_ref.actor.{key}')}")
    if g("actor_rollout_ref.actor.router_replay.mode") == "R3" and g(f"{ROLLOUT}.name") != "native":
        errors.append(f"'actor_rollout_ref.actor.router_replay.mode' = R3 needs '{ROLLOUT}.name' = native (the engine "
                      f"that records each token's experts), got {g(f'{ROLLOUT}.name')!r}")
    gmu = g(f"{ROLLOUT}.gpu_memory_utilization")
    if not 0 < gmu <= 1:
        errors.append(f"'{ROLLOUT}.gpu_memory_utilization' must be in (0, 1], got {gmu}")
    top_p = g(f"{ROLLOUT}.top_p")
    if not 0 < top_p <= 1:
        errors.append(f"'{ROLLOUT}.top_p' must be in (0, 1], got {top_p}")
    if g(f"{ROLLOUT}.temperature") < 0:
        errors.append(f"'{ROLLOUT}.temperature' must be >= 0, got {g(f'{ROLLOUT}.temperature')}")
    if g("reward_model.timeout_s") is not None and g("reward_model.timeout_s") <= 0:
        errors.append(f"'reward_model.timeout_s' must be > 0 or null (no limit), got {g('reward_model.timeout_s')}")
    max_err = g("reward_model.max_error_fraction")
    if max_err is not None and not 0 < max_err <= 1:
        errors.append(f"'reward_model.max_error_fraction' must be in (0, 1] or null (never stop), got {max_err}")
    try:
        parse_required_layers(g("reward_model.sandbox.required_layers"), "reward_model.sandbox.required_layers")
    except ValueError as e:
        errors.append(str(e))
    errors += reward_model_errors(c)

    nodes, per_node = g("trainer.nnodes"), g("trainer.n_gpus_per_node")
    world = nodes * per_node
    sp = g(f"{ACTOR}.ulysses_sequence_parallel_size")
    tp = g(f"{ROLLOUT}.tensor_model_parallel_size")
    n = g(f"{ROLLOUT}.n")
    tbs = g("data.train_batch_size")
    mini = g(f"{ACTOR}.ppo_mini_batch_size")
    world_s = f"world size (trainer.nnodes × trainer.n_gpus_per_node = {nodes} × {per_node} = {world})"

    if tp > per_node:
        errors.append(f"'{ROLLOUT}.tensor_model_parallel_size' = {tp} must be <= trainer.n_gpus_per_node = {per_node} "
                      "(a TP group may not span machines)")
    elif world % tp:
        errors.append(f"'{ROLLOUT}.tensor_model_parallel_size' = {tp} must divide the {world_s}")
    elif tbs % (world // tp):
        errors.append(f"'data.train_batch_size' = {tbs} must be divisible by the rollout dp size "
                      f"(world {world} / tensor_model_parallel_size {tp} = {world // tp})")
    tp_error = model_tp_error(g("actor_rollout_ref.model.path"), tp) if g(f"{ROLLOUT}.name") == "native" else None
    if tp_error:  # the model's heads bound the TP degree (the hf rollout backend runs TP=1 anyway)
        errors.append(tp_error)
    if (tbs * n) % (mini * n):
        errors.append(f"'data.train_batch_size' × rollout.n ({tbs} × {n} = {tbs * n}) must be divisible by "
                      f"'{ACTOR}.ppo_mini_batch_size' × rollout.n ({mini} × {n} = {mini * n})")
    _check_fsdp_size(f"{ACTOR}.fsdp_config.fsdp_size", g(f"{ACTOR}.fsdp_config.fsdp_size"), world, world_s, errors)
    if _check_sp(ACTOR, "actor_rollout_ref.model", sp, g, world, world_s, errors):
        _check_mini_batch(ACTOR, mini, n, world // sp, g(f"{ACTOR}.ppo_micro_batch_size_per_gpu"),
                          _may_be_dynamic(g(f"{ACTOR}.use_dynamic_bsz"), g(f"{ACTOR}.ppo_micro_batch_size_per_gpu")),
                          errors)
    if g(f"{ACTOR}.use_dynamic_bsz") is not False:
        _check_token_len(f"{ACTOR}.ppo_max_token_len_per_gpu", c, errors)
    for sec in (ROLLOUT, REF):
        dynamic = g(f"{sec}.log_prob_use_dynamic_bsz")
        if dynamic is not False:
            _check_token_len(f"{sec}.log_prob_max_token_len_per_gpu", c, errors)
        elif g(f"{sec}.log_prob_micro_batch_size_per_gpu") is None and g(f"{sec}.log_prob_micro_batch_size") is None:
            errors.append(f"'{sec}.log_prob_micro_batch_size_per_gpu' is null: set it (or log_prob_use_dynamic_bsz)")

    if adv == "gae":
        _check_fsdp_size("critic.model.fsdp_config.fsdp_size", g("critic.model.fsdp_config.fsdp_size"), world,
                         world_s, errors)
        critic_sp = g("critic.ulysses_sequence_parallel_size")
        if _check_sp("critic", "critic.model", critic_sp, g, world, world_s, errors):
            _check_mini_batch("critic", g("critic.ppo_mini_batch_size"), n, world // critic_sp,
                              g("critic.ppo_micro_batch_size_per_gpu"),
                              _may_be_dynamic(g("critic.use_dynamic_bsz"), g("critic.ppo_micro_batch_size_per_gpu")),
                              errors)
        if g("critic.use_dynamic_bsz") is not False:
            _check_token_len("critic.ppo_max_token_len_per_gpu", c, errors)

    if g(f"{ACTOR}.use_kl_loss") and g("algorithm.use_kl_in_reward"):
        warnings.append(f"'{ACTOR}.use_kl_loss' and 'algorithm.use_kl_in_reward' are both true: "
                        "the KL penalty is applied twice (verl allows it; usually one is meant)")
    errors += check_limits(c)  # values the types admit but hybridrl does not implement
    from hybridrl.training.lora import check_lora_keys

    errors += check_lora_keys(*(g(f"actor_rollout_ref.model.{k}")
                                for k in ("lora_rank", "lora_alpha", "target_modules")))
    _check_dapo(g, world // tp, errors, warnings)
    _check_speculative(g, errors, warnings)
    _check_partial_rollout(g, errors, warnings)
    if adv in ("grpo", "rloo") and n == 1:
        warnings.append(f"'algorithm.adv_estimator' = {adv} with '{ROLLOUT}.n' = 1: every group has one sample, "
                        "so every advantage is 0 (set rollout.n > 1)")
    if errors:
        raise ConfigError(errors)
    return warnings


def _check_speculative(g, errors: list[str], warnings: list[str]) -> None:
    """rollout.speculative: sizes of the n-gram drafts and the tail threshold (its rules are SpeculativeConfig's)."""
    sec = f"{ROLLOUT}.speculative"
    for key in ("num_draft_tokens", "min_match"):
        if g(f"{sec}.{key}") < 1:
            errors.append(f"'{sec}.{key}' = {g(f'{sec}.{key}')} must be >= 1")
    if g(f"{sec}.max_match") < g(f"{sec}.min_match"):
        errors.append(f"'{sec}.max_match' = {g(f'{sec}.max_match')} must be >= '{sec}.min_match' = "
                      f"{g(f'{sec}.min_match')}")
    most = g(f"{sec}.max_running_seqs")
    if most != "auto" and (isinstance(most, str) or most < 1):
        errors.append(f"'{sec}.max_running_seqs' = {most!r} must be 'auto' or an integer >= 1")
    if not g(f"{sec}.enable"):
        return
    if g(f"{ROLLOUT}.name") != "native":
        warnings.append(f"'{sec}.enable' = true has no effect with '{ROLLOUT}.name' = {g(f'{ROLLOUT}.name')} "
                        "(the native engine speculates)")
    if g(f"{ROLLOUT}.multi_turn.enable"):
        warnings.append(f"'{sec}.enable' = true with multi_turn.enable: multi-turn rollouts decode without "
                        "speculation")


def _check_dapo(g, rollout_dp: int, errors: list[str], warnings: list[str]) -> None:
    """Dynamic sampling, the overlong buffer and rollout correction (DAPO / verl's recipe keys)."""
    fg, tbs, gen = "algorithm.filter_groups", g("data.train_batch_size"), g("data.gen_batch_size")
    if g(f"{fg}.enable") and g(f"{fg}.metric") is None:
        errors.append(f"'{fg}.metric' is null but '{fg}.enable' is true: set acc, score, seq_reward or "
                      "seq_final_reward")
    if g(f"{fg}.max_num_gen_batches") < 0:
        errors.append(f"'{fg}.max_num_gen_batches' = {g(f'{fg}.max_num_gen_batches')} must be >= 0 (0 = no limit)")
    if g(f"{fg}.enable") and g("actor_rollout_ref.rollout.n") == 1:
        warnings.append(f"'{fg}.enable' with rollout.n = 1: a one-sample group is always kept, nothing is filtered")
    if gen is not None:
        if gen <= 0 or gen % rollout_dp:
            errors.append(f"'data.gen_batch_size' = {gen} must be a positive multiple of the rollout dp size "
                          f"{rollout_dp}")
        elif gen != tbs and not g(f"{fg}.enable"):
            errors.append(f"'data.gen_batch_size' = {gen} differs from data.train_batch_size = {tbs} but "
                          f"'{fg}.enable' is false: each step trains on one generation batch, so they must be equal")
    ob = "reward_model.overlong_buffer"
    if g(f"{ob}.enable"):
        if not 0 < g(f"{ob}.len") <= g("data.max_response_length"):
            errors.append(f"'{ob}.len' = {g(f'{ob}.len')} must be in (0, data.max_response_length = "
                          f"{g('data.max_response_length')}]")
        if g(f"{ob}.penalty_factor") < 0:
            errors.append(f"'{ob}.penalty_factor' = {g(f'{ob}.penalty_factor')} must be >= 0")
    rc = "algorithm.rollout_correction"
    if g(f"{rc}.rollout_is") is not None and not g(f"{rc}.rollout_is_threshold") > 0:
        errors.append(f"'{rc}.rollout_is_threshold' = {g(f'{rc}.rollout_is_threshold')} must be > 0")
    if g(f"{rc}.rollout_is_batch_normalize") and g(f"{rc}.rollout_is") is None:
        warnings.append(f"'{rc}.rollout_is_batch_normalize' is true but '{rc}.rollout_is' is null: no weights")
    if g(f"{rc}.rollout_rs") is not None:
        from hybridrl.algorithms.rollout_correction import parse_rs_thresholds

        try:
            parse_rs_thresholds(g(f"{rc}.rollout_rs"), g(f"{rc}.rollout_rs_threshold"))
        except ValueError as e:
            errors.append(str(e))
    elif g(f"{rc}.rollout_rs_threshold") is not None:
        warnings.append(f"'{rc}.rollout_rs_threshold' is set but '{rc}.rollout_rs' is null: nothing is rejected")


def _check_partial_rollout(g, errors: list[str], warnings: list[str]) -> None:
    """Partial rollouts: a budget that can carry something, a staleness limit, and the features they cannot join."""
    pr = f"{ROLLOUT}.partial_rollout"
    if not g(f"{pr}.enable"):
        return
    budget, stale, length = g(f"{pr}.max_new_tokens_per_step"), g(f"{pr}.max_staleness"), g("data.max_response_length")
    if budget is None or budget <= 0:
        errors.append(f"'{pr}.max_new_tokens_per_step' = {budget}: partial rollouts need a positive per-step token "
                      "budget")
    elif budget >= length:
        warnings.append(f"'{pr}.max_new_tokens_per_step' = {budget} >= data.max_response_length = {length}: no "
                        "sample is ever carried, so partial rollouts change nothing")
    if stale < 1:
        errors.append(f"'{pr}.max_staleness' = {stale} must be >= 1 (0 would drop every carried group: set "
                      f"'{pr}.enable' = false instead)")
    elif budget is not None and 0 < budget < length and (stale + 1) * budget < length:
        warnings.append(f"'{pr}.max_new_tokens_per_step' = {budget} with max_staleness = {stale}: a sample longer "
                        f"than {(stale + 1) * budget} tokens (of data.max_response_length = {length}) can never "
                        "finish in time, so its group is always dropped (counted: partial/dropped_stale)")
    conflicts = {f"{ROLLOUT}.name": g(f"{ROLLOUT}.name") != "native",
                 f"{ROLLOUT}.multi_turn.enable": bool(g(f"{ROLLOUT}.multi_turn.enable")),
                 "algorithm.filter_groups.enable": bool(g("algorithm.filter_groups.enable")),
                 "algorithm.adv_estimator": g("algorithm.adv_estimator") == "remax"}
    for key, bad in conflicts.items():
        if bad:
            errors.append(f"'{pr}.enable' = true does not go with '{key}' = {g(key)} (partial rollouts need the "
                          "native engine, single-turn samples, one generation batch a step and no greedy baseline "
                          "rollout)")


def _check_sp(sec: str, model_sec: str, sp: int, g, world: int, world_s: str, errors: list[str]) -> bool:
    """Ulysses degree of `sec`: >= 1, dividing the world, packed inputs when > 1. True when usable."""
    key = f"'{sec}.ulysses_sequence_parallel_size' = {sp}"
    if sp < 1:
        errors.append(f"{key} must be >= 1")
    elif sp > 1 and not g(f"{model_sec}.use_remove_padding"):
        errors.append(f"{key} needs '{model_sec}.use_remove_padding' = true (it splits the packed token row)")
    elif world % sp:
        errors.append(f"{key} must divide the {world_s}")
    else:
        return True
    return False


def _check_fsdp_size(key: str, fsdp: int, world: int, world_s: str, errors: list[str]) -> None:
    if fsdp != -1 and (fsdp <= 0 or world % fsdp):
        errors.append(f"'{key}' = {fsdp} must be -1 (all ranks) or a positive divisor of the {world_s}")


def _check_mini_batch(sec: str, mini: int, n: int, dp: int, micro: int | None, dynamic: bool,
                      errors: list[str]) -> None:
    rows = mini * n
    if rows % dp:
        errors.append(f"'{sec}.ppo_mini_batch_size' × rollout.n ({mini} × {n} = {rows}) must be divisible by "
                      f"the data-parallel size {dp} (world size / ulysses_sequence_parallel_size)")
    elif not dynamic and isinstance(micro, int) and (rows // dp) % micro:
        errors.append(f"per-GPU mini-batch ({rows} rows / dp {dp} = {rows // dp}) must be divisible by "
                      f"'{sec}.ppo_micro_batch_size_per_gpu' = {micro}")
    elif not dynamic and micro is None:
        errors.append(f"'{sec}.ppo_micro_batch_size_per_gpu' is null: set it (or use_dynamic_bsz)")


def _may_be_dynamic(use_dynamic_bsz, micro) -> bool:
    """Whether micro-batches may be token-budgeted: true, or auto with the micro-batch size left to the plan."""
    return use_dynamic_bsz is True or (use_dynamic_bsz == "auto" and (micro is None or micro == "auto"))


def _check_token_len(key: str, c: dict, errors: list[str]) -> None:
    need = c["data"]["max_prompt_length"] + c["data"]["max_response_length"]
    value = dotted_get(c, key)
    if isinstance(value, int) and value < need:
        errors.append(f"'{key}' = {value} must be >= max_prompt_length + max_response_length = {need} "
                      "with dynamic batch size (a single sequence must fit)")


def validate_config(cfg: DictConfig | dict, defaults: str = "ppo_trainer") -> list[str]:
    """Both passes against the sections of the packaged `<defaults>.yaml`; returns warnings, raises ConfigError."""
    check_schema(_plain(cfg), ROOTS[defaults])
    return check_semantics(cfg) if defaults == "ppo_trainer" else []
