"""What the default YAML cannot say about itself: types of null-default keys, allowed values, aliases.

Choices:
- The default YAML *is* the schema (key set and, for non-null defaults, the type), so a new key needs
  no second declaration. Only keys whose default is `null` need an entry in `NULL_DEFAULT_TYPES`
  (a test fails when one is missing), and keys that take more than one shape get `EXTRA_TYPES`.
- Free dicts (default `{}`, e.g. `model.override_config`) take any keys: they are passed to HF configs.
  Only there may `+key=value` add a key; anywhere else a new key is a typo and is an error.
- Aliases keep a verl user's YAML working: `rollout.name: vllm|sglang` and `strategy: fsdp` are rewritten to
  our names (`native`, `fsdp2`) by the loader with a logged WARNING (saying, for the rollout, that no vLLM or
  SGLang runs), so downstream code sees one spelling.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent
_DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
_LOSS_AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_KL_TYPES = ("kl", "k1", "k2", "mse", "k3", "low_var_kl", "abs")
# the policy losses registered in hybridrl.algorithms.registry (a test keeps the two equal)
POLICY_LOSS_MODES = ("vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "cispo")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")

# type of each key whose default is null (all of them are nullable)
NULL_DEFAULT_TYPES: dict[str, type | tuple[type, ...]] = {
    "data.tokenizer": str,
    "data.val_batch_size": int,
    "actor_rollout_ref.model.external_lib": str,
    "actor_rollout_ref.actor.ppo_micro_batch_size": int,
    "actor_rollout_ref.actor.clip_ratio_low": float,
    "actor_rollout_ref.actor.clip_ratio_high": float,
    "actor_rollout_ref.ref.log_prob_micro_batch_size": int,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": int,
    "critic.ppo_micro_batch_size": int,
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": int,
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": int,
    "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": int,
    "actor_rollout_ref.rollout.partial_rollout.max_new_tokens_per_step": int,
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": str,
    "actor_rollout_ref.model.custom_chat_template": str,
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": str,
    "actor_rollout_ref.rollout.multi_turn.agent_loop.path": str,
    "actor_rollout_ref.rollout.multi_turn.agent_loop.name": str,
    "custom_reward_function.path": str,
    "reward_model.model.path": str,
    "reward_model.model.input_tokenizer": str,
    "reward_model.micro_batch_size": int,
    "reward_model.max_length": int,
    "trainer.total_training_steps": int,
    "trainer.ray_address": str,
    "trainer.resume_from_path": str,
    "trainer.max_actor_ckpt_to_keep": int,
    "trainer.max_critic_ckpt_to_keep": int,
    "data.gen_batch_size": int,
    "algorithm.filter_groups.metric": str,
    "algorithm.rollout_correction.rollout_is": str,
    "algorithm.rollout_correction.rollout_rs": str,
    "algorithm.rollout_correction.rollout_rs_threshold": (str, float),
}

# keys that accept another shape besides their default's type
EXTRA_TYPES: dict[str, tuple[type, ...]] = {
    "data.train_files": (str, list),
    "data.val_files": (str, list),
    "trainer.logger": (list, str),
    "actor_rollout_ref.rollout.log_prob_unshard_once": (str, bool),
    "actor_rollout_ref.actor.update_unshard_once": (str, bool),
    "actor_rollout_ref.ref.log_prob_unshard_once": (str, bool),
    "critic.forward_unshard_once": (str, bool),
    "actor_rollout_ref.actor.old_log_prob_pass": (str, bool),
    "actor_rollout_ref.actor.use_prefix_grouper": (str, bool),
    "actor_rollout_ref.model.enable_gradient_checkpointing": (str, bool),
    "critic.model.enable_gradient_checkpointing": (str, bool),
    "actor_rollout_ref.model.use_liger": (str, bool),
    # token-budgeted micro-batches: 'auto' (on where the micro-batch size is left to the plan) or a bool, and
    # 'auto' (the plan's budget) or a number of tokens
    **dict.fromkeys(("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
                     "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "critic.use_dynamic_bsz",
                     "actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding",
                     "actor_rollout_ref.rollout.async_scheduling"), (str, bool)),
    **dict.fromkeys(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                     "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                     "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu"),
                    (str, int)),
    "actor_rollout_ref.model.lora_alpha": (int, float),
    "actor_rollout_ref.rollout.speculative.max_running_seqs": (str, int),   # 'auto' (from the device) or a count
    "actor_rollout_ref.model.target_modules": (str, list),   # 'all-linear' or module names
    "reward_model.sandbox.required_layers": (list, str),   # layer names, or 'all'
    # micro-batch sizes: 'auto' (the run plan chooses) or a number of rows
    **dict.fromkeys(("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                     "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
                     "reward_model.micro_batch_size_per_gpu"), (str, int)),
}

# keys that may be null although their default is not (per-GPU micro-batches: null with dynamic batch size,
# as in verl; the semantic check then says which key is missing)
NULLABLE: set[str] = {
    "data.val_files",
    "reward_model.timeout_s",            # no time limit: scored in-process
    "reward_model.max_error_fraction",   # never stop on reward errors
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
}

ENUMS: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right"),
    "actor_rollout_ref.actor.strategy": ("fsdp2",),
    "critic.strategy": ("fsdp2",),
    "actor_rollout_ref.actor.loss_agg_mode": _LOSS_AGG,
    "actor_rollout_ref.actor.policy_loss.loss_mode": POLICY_LOSS_MODES,
    "actor_rollout_ref.actor.checkpoint.contents": CHECKPOINT_CONTENTS,  # checked per entry
    "critic.loss_agg_mode": _LOSS_AGG,
    "actor_rollout_ref.actor.kl_loss_type": _KL_TYPES,
    "actor_rollout_ref.actor.router_replay.mode": ("disabled", "R3"),   # training/moe.py REPLAY_MODES
    "algorithm.kl_penalty": _KL_TYPES,
    "actor_rollout_ref.actor.optim.warmup_style": ("constant", "cosine"),
    "critic.optim.warmup_style": ("constant", "cosine"),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": _DTYPES,
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": _DTYPES,
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype": _DTYPES,
    "actor_rollout_ref.rollout.name": ("native", "hf"),
    "actor_rollout_ref.rollout.mode": ("sync",),
    "actor_rollout_ref.rollout.dtype": _DTYPES,
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": ("left", "middle", "right"),
    "actor_rollout_ref.rollout.multi_turn.format": ("hermes", "qwen3_coder", "llama3_json"),
    "reward_model.reward_manager": ("naive", "batch"),
    "reward_model.style": ("model", "judge"),
    "reward_model.truncation": ("error", "left", "right"),
    "algorithm.filter_groups.metric": ("acc", "score", "seq_reward", "seq_final_reward"),
    "algorithm.rollout_correction.rollout_is": ("token", "sequence"),
    "algorithm.adv_estimator": ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "trainer.logger": ("console", "file", "tensorboard", "wandb", "mlflow"),  # checked per entry
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "trainer.device": ("auto", "cuda", "cpu"),
    "actor_rollout_ref.rollout.log_prob_unshard_once": ("auto", True, False),
    "actor_rollout_ref.actor.update_unshard_once": ("auto", True, False),
    "actor_rollout_ref.ref.log_prob_unshard_once": ("auto", True, False),
    "critic.forward_unshard_once": ("auto", True, False),
    "actor_rollout_ref.actor.old_log_prob_pass": ("auto", True, False),
    "actor_rollout_ref.actor.use_prefix_grouper": ("auto", True, False),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("auto", True, False),
    "critic.model.enable_gradient_checkpointing": ("auto", True, False),
    "actor_rollout_ref.model.use_liger": ("auto", True, False),
    **dict.fromkeys(("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
                     "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "critic.use_dynamic_bsz",
                     "actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding",
                     "actor_rollout_ref.rollout.async_scheduling"),
                    ("auto", True, False)),
}

# why an alias is read as another value, in the warning the loader logs
ALIAS_NOTES: dict[str, str] = {
    "actor_rollout_ref.rollout.name": "hybridrl has no vLLM or SGLang backend: rollouts run on its native engine "
                                      "(set rollout.name=native to silence this)",
    "reward_model.reward_manager": "hybridrl's per-sample manager, which applies reward_model.overlong_buffer as "
                                   "verl's DAPO manager does (set reward_manager=naive to silence this)",
}

# verl spellings rewritten to ours at load (key -> {alias: canonical})
ALIASES: dict[str, dict[str, str]] = {
    "actor_rollout_ref.rollout.name": {"vllm": "native", "sglang": "native"},
    "actor_rollout_ref.actor.strategy": {"fsdp": "fsdp2"},
    "critic.strategy": {"fsdp": "fsdp2"},
    "reward_model.reward_manager": {"dapo": "naive"},
}


def load_defaults(name: str = "ppo_trainer") -> DictConfig:
    """The packaged `hybridrl/config/<name>.yaml` (the schema), interpolations not yet resolved."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no packaged config named {name!r} ({path} does not exist); have {have}")
    return OmegaConf.load(path)


def type_name(t: type | tuple[type, ...]) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}
    if isinstance(t, tuple):
        return " | ".join(names.get(x, x.__name__) for x in t)
    return names.get(t, t.__name__)
