"""What the sections' rules share: the problems found so far, and checks several sections make with their own keys
(positive sizes, FSDP and Ulysses degrees, mini-batch arithmetic, token budgets). Every message names the key, the
value and the rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridrl.config.errors import ConfigError

__all__ = ["Findings", "check_fsdp_size", "check_token_len", "check_update_batches", "world_text"]


@dataclass
class Findings:
    """Errors (the config is refused, all of them in one ConfigError) and warnings (logged) of a config's rules."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def raise_errors(self) -> None:
        if self.errors:
            raise ConfigError(self.errors)

    def positive(self, section: Any, prefix: str, names: tuple[str, ...]) -> None:
        """Each of `names` (dotted below `section`, whose path is `prefix`) must be > 0."""
        for name in names:
            value = _get(section, name)
            if value <= 0:
                self.errors.append(f"'{prefix}.{name}' must be > 0, got {value}")

    def positive_or_unset(self, section: Any, prefix: str, names: tuple[str, ...]) -> None:
        """Each of `names` must be > 0, null or (micro-batch sizes and token budgets) 'auto': the run plan chooses."""
        for name in names:
            value, key = _get(section, name), f"{prefix}.{name}"
            if isinstance(value, str):
                if value != "auto":
                    self.errors.append(f"'{key}' must be 'auto', a positive integer or null, got {value!r}")
            elif value is not None and value <= 0:
                self.errors.append(f"'{key}' must be > 0 or null, got {value}")


def _get(section: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        section = getattr(section, part)
    return section


def world_text(cfg) -> str:
    t = cfg.trainer
    return (f"world size (trainer.nnodes × trainer.n_gpus_per_node = {t.nnodes} × {t.n_gpus_per_node} = "
            f"{t.world_size})")


def check_fsdp_size(key: str, fsdp: int, cfg, found: Findings) -> None:
    if fsdp != -1 and (fsdp <= 0 or cfg.trainer.world_size % fsdp):
        found.errors.append(f"'{key}' = {fsdp} must be -1 (all ranks) or a positive divisor of the {world_text(cfg)}")


def check_sp(prefix: str, model_prefix: str, sp: int, use_remove_padding, cfg, found: Findings) -> bool:
    """Ulysses degree of the role at `prefix`: >= 1, dividing the world, packed inputs when > 1, dividing the attention
    heads of the model at `model_prefix`.path (where its config.json can be read). True when usable."""
    key = f"'{prefix}.ulysses_sequence_parallel_size' = {sp}"
    if sp < 1:
        found.errors.append(f"{key} must be >= 1")
    elif sp > 1 and not use_remove_padding:
        found.errors.append(f"{key} needs '{model_prefix}.use_remove_padding' = true (it splits the packed token row)")
    elif cfg.trainer.world_size % sp:
        found.errors.append(f"{key} must divide the {world_text(cfg)}")
    else:
        from hybridrl.dotted import dotted_get
        from hybridrl.models.tp_rules import model_sp_error

        heads_error = model_sp_error(dotted_get(cfg, f"{model_prefix}.path"), sp,
                                     f"{prefix}.ulysses_sequence_parallel_size")
        if heads_error is None:
            return True
        found.errors.append(heads_error)
    return False


def check_mini_batch(prefix: str, mini: int, n: int, dp: int, micro: int | str | None, dynamic: bool,
                     found: Findings) -> None:
    rows = mini * n
    if rows % dp:
        found.errors.append(f"'{prefix}.ppo_mini_batch_size' × rollout.n ({mini} × {n} = {rows}) must be divisible "
                            f"by the data-parallel size {dp} (world size / ulysses_sequence_parallel_size)")
    elif not dynamic and isinstance(micro, int) and (rows // dp) % micro:
        found.errors.append(f"per-GPU mini-batch ({rows} rows / dp {dp} = {rows // dp}) must be divisible by "
                            f"'{prefix}.ppo_micro_batch_size_per_gpu' = {micro}")
    elif not dynamic and micro is None:
        found.errors.append(f"'{prefix}.ppo_micro_batch_size_per_gpu' is null: set it (or use_dynamic_bsz)")


def check_update_batches(prefix: str, model_prefix: str, role, use_remove_padding, cfg, found: Findings) -> None:
    """A trained role's (the actor's at `prefix`, or the critic's) Ulysses degree, mini-batch arithmetic and token
    budget (`role`: its section; `cfg`: the whole PPOConfig)."""
    tbs, n, mini = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, role.ppo_mini_batch_size
    if (tbs * n) % (mini * n):
        found.errors.append(f"'data.train_batch_size' × rollout.n ({tbs} × {n} = {tbs * n}) must be divisible by "
                            f"'{prefix}.ppo_mini_batch_size' × rollout.n ({mini} × {n} = {mini * n})")
    sp, micro = role.ulysses_sequence_parallel_size, role.ppo_micro_batch_size_per_gpu
    if check_sp(prefix, model_prefix, sp, use_remove_padding, cfg, found):
        check_mini_batch(prefix, role.ppo_mini_batch_size, cfg.actor_rollout_ref.rollout.n,
                         cfg.trainer.world_size // sp, micro, may_be_dynamic(role.use_dynamic_bsz, micro), found)
    if role.use_dynamic_bsz is True:   # auto: the plan checks the budget where it turns dynamic batches on
        check_token_len(f"{prefix}.ppo_max_token_len_per_gpu", role.ppo_max_token_len_per_gpu, cfg, found, sp)


def may_be_dynamic(use_dynamic_bsz: bool | str, micro: int | str | None) -> bool:
    """Whether micro-batches may be token-budgeted: true, or auto with the micro-batch size left to the plan."""
    return use_dynamic_bsz is True or (use_dynamic_bsz == "auto" and (micro is None or micro == "auto"))


def check_token_len(key: str, value: int | str, cfg, found: Findings, sp: int = 1) -> None:
    """A per-GPU token budget must let a micro-batch hold one sequence: with Ulysses (`sp` ranks) a micro-batch holds
    value x sp tokens (verl's meaning), so the budget is at least prompt + response over sp."""
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    need = -(-seq // sp)
    if isinstance(value, int) and value < need:
        rule = (f"max_prompt_length + max_response_length = {seq}" if sp == 1 else
                f"(max_prompt_length + max_response_length = {seq}) / ulysses_sequence_parallel_size {sp} = {need}")
        found.errors.append(f"'{key}' = {value} must be >= {rule} with dynamic batch size (a single sequence must "
                            "fit a micro-batch)")
