"""What keys a config has and what each accepts: the section dataclasses (hybridrl/config/sections/) are the schema,
their annotations the types and allowed values; this module checks a loaded tree against them.

Choices:
- The packaged YAML holds the defaults, the dataclasses the keys, types and documentation; a test keeps their keys
  equal, so a new key is declared in both.
- Free dicts (annotated `dict`, default `{}`, e.g. `model.override_config`) take any keys: they are passed to HF
  configs. Only there may `+key=value` add a key; anywhere else a new key is a typo and is an error.
- A `Literal` in a field's type lists its allowed values; mixed with `bool` (`Literal["auto"] | bool`) the bools are
  allowed too. Mixed with a number (`Literal["auto"] | int`, micro-batch sizes) it is not checked here: the
  section's rules say which numbers are valid, in one message.
- Aliases keep a verl user's YAML working: `rollout.name: vllm|sglang` and `strategy: fsdp` are rewritten to
  our names (`native`, `fsdp2`) by the loader with a logged WARNING (saying, for the rollout, that no vLLM or
  SGLang runs), so downstream code sees one spelling.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from omegaconf import DictConfig, OmegaConf

from hybridrl.config.errors import ConfigError
from hybridrl.config.sections.base import Section, field_types, members, type_name
from hybridrl.config.sections.values import AdvEstimator, PolicyLossMode

__all__ = ["ALIASES", "ALIAS_NOTES", "CONFIG_DIR", "KEY_EQUALS", "KEY_RENAMES", "SFT_KEY_RENAMES", "SFT_REFUSED",
           "SFT_KEY_EQUALS", "VERL_REFUSED", "allowed_values", "check_schema", "closest_key", "key_equals", "key_paths",
           "key_renames", "load_defaults",
           "root_name", "unknown_hint", "verl_refusal"]

CONFIG_DIR = Path(__file__).resolve().parent

# why an alias is read as another value, in the warning the loader logs
ALIAS_NOTES: dict[str, str] = {
    "actor_rollout_ref.rollout.name": "hybridrl has no vLLM or SGLang backend: rollouts run on its native engine "
                                      "(set rollout.name=native to silence this)",
    "reward_model.reward_manager": "hybridrl's per-sample manager, which applies reward_model.overlong_buffer as "
                                   "verl's DAPO manager does and scores the samples in parallel worker processes "
                                   "(reward_model.scorer_workers), each within reward_model.timeout_s, as verl's "
                                   "PRIME manager does (set reward_manager=naive to silence this)",
    "actor_rollout_ref.rollout.mode": "hybridrl's engine has one mode, in-process, for single-turn, multi-turn and "
                                      "agent-loop rollouts alike (verl's async server mode samples the same "
                                      "distribution); set rollout.mode=sync to silence this",
}

# verl spellings rewritten to ours at load (key -> {alias: canonical})
ALIASES: dict[str, dict[str, str]] = {
    "actor_rollout_ref.rollout.name": {"vllm": "native", "sglang": "native"},
    "actor_rollout_ref.actor.strategy": {"fsdp": "fsdp2"},
    "critic.strategy": {"fsdp": "fsdp2"},
    "reward_model.reward_manager": {"dapo": "naive", "prime": "naive"},
    "actor_rollout_ref.rollout.mode": {"async": "sync"},
}


# verl key spellings read as ours at load (prefix -> our prefix, same meaning): newer verl recipes pass DAPO's overlong
# buffer to the reward manager as reward_kwargs (`+reward_model.reward_kwargs.overlong_buffer_cfg.len=...`), name
# what a checkpoint saves `save_contents`, and spell the optimizer's clipping and schedule as its engine workers read
# them (`optim.clip_grad`, `optim.lr_scheduler_type`; verl's legacy workers read `grad_clip` and `warmup_style`)
KEY_RENAMES: dict[str, str] = {
    "reward_model.reward_kwargs.overlong_buffer_cfg": "reward_model.overlong_buffer",
    "actor_rollout_ref.actor.checkpoint.save_contents": "actor_rollout_ref.actor.checkpoint.contents",
    "actor_rollout_ref.actor.optim.clip_grad": "actor_rollout_ref.actor.grad_clip",
    "critic.optim.clip_grad": "critic.grad_clip",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "actor_rollout_ref.actor.optim.warmup_style",
    "critic.optim.lr_scheduler_type": "critic.optim.warmup_style",
}
# verl's SFT trainer spellings (sft_trainer.yaml): its warmup ratio under the PPO optimizer's name, and its packing
# switch at the top level
SFT_KEY_RENAMES: dict[str, str] = {
    "optim.lr_warmup_steps_ratio": "optim.warmup_steps_ratio",
    "use_remove_padding": "model.use_remove_padding",
    "trainer.checkpoint.save_contents": "trainer.checkpoint.contents",
}


def key_renames(root: str) -> dict[str, str]:
    """The verl spellings read as ours for the config `root` (ppo_trainer | sft_trainer)."""
    return SFT_KEY_RENAMES if root == "sft_trainer" else KEY_RENAMES


# verl keys whose only value here is another key's: key -> (that key, what the rule is)
KEY_EQUALS: dict[str, tuple[str, str]] = {
    "reward_model.reward_kwargs.max_resp_len": (
        "data.max_response_length", "the overlong buffer counts from data.max_response_length (verl's recipes set "
        "max_resp_len to it)"),
    "actor_rollout_ref.actor.checkpoint.load_contents": (
        "actor_rollout_ref.actor.checkpoint.contents", "a resume loads what the checkpoint saved (verl's default "
        "for this key)"),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "the reference model runs on the actor's training "
        "mesh and its Ulysses groups (verl's default for this key)"),
    "actor_rollout_ref.ref.strategy": (
        "actor_rollout_ref.actor.strategy", "the reference model is sharded as the actor is, on its mesh"),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": (
        "actor_rollout_ref.actor.fsdp_config.fsdp_size", "the reference model is sharded as the actor is, on its mesh"),
    "data.trust_remote_code": (
        "actor_rollout_ref.model.trust_remote_code", "prompts are tokenized with the policy's tokenizer, loaded with "
        "the model's trust_remote_code"),
}


SFT_KEY_EQUALS: dict[str, tuple[str, str]] = {
    "trainer.checkpoint.load_contents": (
        "trainer.checkpoint.contents", "a resume loads what the checkpoint saved (verl's default for this key)"),
}


def key_equals(root: str) -> dict[str, tuple[str, str]]:
    """The verl keys of the config `root` whose only value here is another key's."""
    return SFT_KEY_EQUALS if root == "sft_trainer" else KEY_EQUALS


# verl keys refused with the reason (key or section prefix -> why it has no counterpart here and what to do),
# named in the unknown-key error in place of a guessed closest key
VERL_REFUSED: dict[str, str] = {
    "actor_rollout_ref.rollout.engine_kwargs": "vLLM / SGLang engine arguments; hybridrl's engine is configured by "
    "the rollout.* keys: remove it",
    "actor_rollout_ref.rollout.max_model_len": "the run plan sets the engine's longest sequence to "
    "data.max_prompt_length + data.max_response_length: remove it",
    "actor_rollout_ref.actor.use_torch_compile": "the training model is not torch.compiled; its fused kernels come "
    "from Liger (actor_rollout_ref.model.use_liger) and hybridrl's own: remove it",
    "actor_rollout_ref.ref.use_torch_compile": "the reference model is not torch.compiled: remove it",
    "actor_rollout_ref.actor.megatron": "hybridrl trains with FSDP2 only; tensor-parallel generation is "
    "rollout.tensor_model_parallel_size and sequence parallelism ulysses_sequence_parallel_size: remove the megatron "
    "keys",
    "actor_rollout_ref.ref.megatron": "hybridrl trains with FSDP2 only (the reference shares the actor's mesh): "
    "remove the megatron keys",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "the training model is not torch.compiled: remove it",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": "the reference model is not torch.compiled: remove it",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": "an FSDP1 setting; FSDP2 prefetches the next layer's "
    "all-gather on its own: remove it",
    "actor_rollout_ref.ref.fsdp_config.forward_prefetch": "an FSDP1 setting; FSDP2 prefetches the next layer's "
    "all-gather on its own: remove it",
    "actor_rollout_ref.actor.fsdp_config.offload_policy": "offloading is actor.fsdp_config.param_offload and "
    "optimizer_offload (auto: the run plan's choice): use those",
    "actor_rollout_ref.ref.fsdp_config.offload_policy": "the reference's offloading is ref.fsdp_config.param_offload: "
    "use that",
    "actor_rollout_ref.rollout.data_parallel_size": "the engine's data-parallel size is the world size over "
    "rollout.tensor_model_parallel_size: remove it",
    "actor_rollout_ref.rollout.expert_parallel_size": "the engine shards experts by tensor parallelism, not expert "
    "parallelism: remove it",
    "actor_rollout_ref.rollout.checkpoint_engine": "the actor's weights reach the engine one tensor at a time through "
    "the reshard (hybrid/reshard.py), never in buckets: remove it",
    "actor_rollout_ref.nccl_timeout": "collectives use torch.distributed's default timeout: remove it",
    "global_profiler": "no profiler integration; benchmarks/profile_update.py and profile_decode.py profile the "
    "update and the decode step: remove the global_profiler keys",
    "actor_rollout_ref.actor.profiler": "no profiler integration (see benchmarks/profile_update.py): remove it",
    "actor_rollout_ref.ref.profiler": "no profiler integration: remove it",
    "actor_rollout_ref.rollout.profiler": "no profiler integration (see benchmarks/profile_decode.py): remove it",
    "critic.profiler": "no profiler integration: remove it",
    "actor_rollout_ref.rollout.quantization": "the engine runs the actor's weights in the model dtype (no "
    "quantized rollout): remove it",
    "actor_rollout_ref.actor.optim.override_optimizer_config": "Megatron optimizer options; the FSDP2 actor's "
    "optimizer offload is actor.fsdp_config.optimizer_offload: remove them",
    "data.custom_cls": "a dataset class of your own is not loaded; convert the rows to the trainer's parquet schema "
    "(hybridrl data convert) and point data.train_files at it",
    "data.sampler": "no curriculum sampler classes; the prompts are shuffled by data.shuffle / data.seed: remove it",
    "data.return_full_prompt": "the rendered prompt is not carried in the batch (data.return_raw_chat carries the "
    "messages): remove it",
    "data.return_multi_modal_inputs": "multimodal prompts are not supported (text chats only): remove it",
    "data.image_patch_size": "multimodal prompts are not supported (text chats only): remove it",
    "data.datagen": "no dynamic data generation: the prompts are data.train_files' rows: remove it",
    "data.cache_dir": "data files are read directly, not through a datasets cache: remove it",
    "data.need_tools_kwargs": "a multi-turn run passes each row's extra_info.tools_kwargs to its tools whether "
    "or not this is set: remove it",
    "actor_rollout_ref.rollout.agent": "verl's agent-loop workers; an agent loop here is a subclass of "
    "hybridrl.rollout.agent_loop.AgentLoop named by actor_rollout_ref.rollout.multi_turn.agent_loop.path / .name "
    "(.kwargs go to its constructor), run by the engine in-process: use those keys",
    "reward_model.reward_manager.source": "reward managers are chosen by name (naive, batch; verl's dapo and prime "
    "are read as naive); scoring code of your own is custom_reward_function.path / .name: use that",
    "reward_model.reward_manager.module": "reward managers are chosen by name; scoring code of your own is "
    "custom_reward_function.path / .name: use that",
    "data.return_raw_input_ids": "a reward model reads the policy's token ids, or re-renders the chat with "
    "reward_model.model.input_tokenizer: remove it",
    "data.validation_shuffle": "validation is not shuffled: remove it",
    "data.tool_config_path": "the tool file is actor_rollout_ref.rollout.multi_turn.tool_config_path: set that",
    "reward_model.sandbox_fusion": "no remote sandbox service; code runs in hybridrl's local sandbox "
    "(reward_model.sandbox.*): remove it",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": "multi-turn trajectories are the engine's "
    "own token ids, with the tool and user turns rendered once by the chat template: remove it",
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": "multi-turn trajectories are the engine's "
    "own token ids, never re-tokenized, so there is nothing to check: remove it",
}



# verl's SFT trainer keys refused with the reason (the PPO table's reasons apply to the keys both share)
SFT_REFUSED: dict[str, str] = {
    "data.chat_template": "a chat template of your own is model.custom_chat_template (a Jinja string or file): use that",
    "data.balance_dp_token": "each rank takes train_batch_size / world rows of the shuffled order: remove it",
    "model.fsdp_config.cpu_offload": "SFT keeps its parameters and optimizer state on the GPU: remove it",
    "model.fsdp_config.offload_params": "SFT keeps its parameters on the GPU: remove it",
    "model.fsdp_config.wrap_policy": "FSDP2 shards each decoder layer: remove it",
    "model.external_lib": "SFT loads transformers' own model classes (the RL actor takes "
    "actor_rollout_ref.model.external_lib): remove it",
    "trainer.default_hdfs_dir": "checkpoints are written to trainer.default_local_dir only: remove it",
    "optim.override_optimizer_config": "the optimizer is torch's AdamW with optim.*: remove it",
}


def verl_refusal(path: str, root: str = "ppo_trainer") -> str | None:
    """Why a verl key (or one under a verl section) is refused here, or None for any other unknown key."""
    tables = (SFT_REFUSED, VERL_REFUSED) if root == "sft_trainer" else (VERL_REFUSED,)
    return next((why for table in tables for key, why in table.items() if path == key or path.startswith(key + ".")),
                None)


def root_name(root: type[Section]) -> str:
    """The packaged config a root section is read from (ppo_trainer | sft_trainer)."""
    return "sft_trainer" if root.__name__ == "SFTConfig" else "ppo_trainer"


def load_defaults(name: str = "ppo_trainer") -> DictConfig:
    """The packaged `hybridrl/config/<name>.yaml` (the defaults), interpolations not yet resolved."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no packaged config named {name!r} ({path} does not exist); have {have}")
    return OmegaConf.load(path)


def is_section(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, Section)


def key_paths(cls: type[Section], prefix: str = "") -> list[str]:
    """Every key of a section tree, sections included, in declaration order."""
    out = []
    for name, ann in field_types(cls).items():
        out.append(f"{prefix}{name}")
        if is_section(ann):
            out += key_paths(ann, f"{prefix}{name}.")
    return out


def closest_key(path: str, siblings: list[str], all_paths: list[str]) -> str | None:
    """A misspelt key among its siblings; else the same key in another section; else a close key anywhere.
    Compared on the last name only: full paths share long prefixes that make everything look close."""
    leaf = path.rsplit(".", 1)[-1]
    by_leaf = lambda paths: {p.rsplit(".", 1)[-1]: p for p in reversed(paths)}  # noqa: E731
    near = difflib.get_close_matches(leaf, list(by_leaf(siblings)), n=1, cutoff=0.6)
    if near:
        return by_leaf(siblings)[near[0]]
    same_leaf = [p for p in all_paths if p.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return same_leaf[0]
    near = difflib.get_close_matches(leaf, list(by_leaf(all_paths)), n=1, cutoff=0.75)
    return by_leaf(all_paths)[near[0]] if near else None


def _is(value: Any, ann: Any) -> bool:
    """Whether `value` has the type of one member of a union (a Literal's by its values' type; ints pass as
    floats, bools never pass as numbers)."""
    if get_origin(ann) is Literal:
        ann = type(get_args(ann)[0])
    elif get_origin(ann) is list:
        ann = list
    if ann is type(None):
        return value is None
    if isinstance(value, bool):
        return ann is bool
    if ann is float:
        return isinstance(value, int | float)
    return isinstance(value, ann)


def allowed_values(ann: Any, registered: bool = True) -> tuple | None:
    """The values a field (or each entry of its list) may take, or None when its type alone decides. Names
    registered with register_policy_loss / register_adv_est (e.g. by model.external_lib, which the loader imports
    before validating) are allowed besides the built-in ones; `registered=False` gives the built-in ones only (the
    docs, which must not depend on what this process happened to register)."""
    ms = [m for m in members(ann) if m is not type(None)]
    literals = [m for m in ms if get_origin(m) is Literal]
    lists = [get_args(m)[0] for m in ms if get_origin(m) is list]
    literals += [e for e in lists if get_origin(e) is Literal]
    if not literals or any(m is not bool and get_origin(m) not in (Literal, list) for m in ms) or \
            any(get_origin(e) is not Literal for e in lists):
        return None
    values = tuple(dict.fromkeys(v for lit in literals for v in get_args(lit)))
    values += (True, False) if bool in ms else ()
    return values + (_registered(literals[0]) if registered else ())


def _registered(literal: Any) -> tuple[str, ...]:
    if literal not in (PolicyLossMode, AdvEstimator):
        return ()
    from hybridrl.algorithms import registry

    reg = registry.POLICY_LOSS_REGISTRY if literal == PolicyLossMode else registry.ADV_ESTIMATOR_REGISTRY
    return tuple(sorted(set(reg) - set(get_args(literal))))


def _leaf_errors(path: str, value: Any, ann: Any) -> list[str]:
    ms = members(ann)
    if value is None:
        return [] if type(None) in ms else [f"'{path}' must be {type_name(ann)}, got null"]
    if not any(_is(value, m) for m in ms):
        return [f"'{path}' must be {type_name(ann)}, got {value!r} ({type(value).__name__})"]
    if isinstance(value, list):
        elem = next(get_args(m)[0] for m in ms if get_origin(m) is list)
        bad = [v for v in value if not any(_is(v, e) for e in members(elem))]
        if bad:
            return [f"'{path}' entries must be {type_name(elem)}, got {bad!r}"]
    allowed = allowed_values(ann)
    if allowed is None:
        return []
    return [f"'{path}' = {v!r} is not one of {list(allowed)}" for v in (value if isinstance(value, list) else [value])
            if v not in allowed]


def unknown_hint(path: str, siblings: list[str], all_paths: list[str], root: str = "ppo_trainer") -> str:
    """What follows "unknown key 'path'": verl's refusal reason where it is one of its keys (and the default value
    that would be accepted: verl_defaults.py), else the closest key. `root`: the config (ppo_trainer | sft_trainer)."""
    from hybridrl.config.verl_defaults import verl_defaults

    why = verl_refusal(path, root)
    table = verl_defaults(root)
    if why:
        return f": verl's key, {why}" + (f" (or set verl's default, {table[path]!r}, which changes nothing)"
                                          if path in table else "")
    if path in table:
        return (f": verl's key, which hybridrl does not use: remove it or set verl's default, {table[path]!r}, which "
                "changes nothing")
    hint = closest_key(path, siblings, all_paths)
    return f"; did you mean '{hint}'?" if hint else ""


def check_schema(tree: dict, root: type[Section]) -> None:
    """Raise ConfigError listing unknown keys, wrong types and values outside their allowed ones."""
    all_paths = key_paths(root)
    errors: list[str] = []

    def walk(node: dict, cls: type[Section], prefix: str) -> None:
        types = field_types(cls)
        for key, value in node.items():
            path = f"{prefix}{key}"
            if key not in types:
                errors.append(f"unknown key '{path}'" + unknown_hint(path, [f"{prefix}{k}" for k in types],
                                                                      all_paths, root_name(root)))
            elif is_section(types[key]) or types[key] is dict:
                if not isinstance(value, dict):
                    errors.append(f"'{path}' must be a section (dict), got {value!r}")
                elif types[key] is not dict:  # a free dict takes any keys (e.g. override_config)
                    walk(value, types[key], path + ".")
            else:
                errors.extend(_leaf_errors(path, value, types[key]))

    walk(tree, root, "")
    if errors:
        raise ConfigError(errors)
