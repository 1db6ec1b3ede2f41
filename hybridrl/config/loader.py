"""Load a config: packaged default YAML <- optional user YAML <- command-line overrides, then validate and build the
typed config once (frozen section dataclasses, `config/sections/`); nothing after this module reads the YAML tree.

Override syntax follows verl/Hydra so a verl command line carries over:
  `a.b=c`    set an existing key (an unknown key is an error naming the closest known key);
  `+a.b=c`   add a key that does not exist. Allowed only inside free dicts (keys whose default is `{}`,
             e.g. `actor_rollout_ref.model.override_config`, forwarded to the HF model config): anywhere
             else a new key would be ignored by the code, so it is an error rather than a silent no-op. On a key
             that exists here it sets it, with a logged warning: verl's recipes add keys its base config lacks
             and ours has (`+algorithm.filter_groups.enable=True`, `+trainer.rollout_data_dir=...`), where
             Hydra's "already exists" error would stop a verl command line that is valid in verl;
  `++a.b=c`  set or add (same free-dict rule for adding).
Values are parsed as YAML (ints, floats incl. `1e-6`, bools, `null`, lists `[a,b]`, dicts `{k: v}`); an
empty value is the empty string. Interpolations (`${data.max_prompt_length}`) are resolved after all
overrides, so overriding the source moves its dependants.

A user YAML is nested like verl's; dotted keys inside it (`actor_rollout_ref.actor.fsdp_config.param_offload:
False`, as the seed document writes them) are expanded. verl spellings in `schema.ALIASES` (rollout
`vllm`/`sglang`, strategy `fsdp`) are rewritten to ours with a logged WARNING, and so are verl key spellings in
`schema.KEY_RENAMES` (`reward_model.reward_kwargs.overlong_buffer_cfg.*`, added with `+` in verl's recipes,
`checkpoint.save_contents`; the SFT config's are `schema.SFT_KEY_RENAMES`);
`schema.KEY_EQUALS` keys (e.g. `reward_model.reward_kwargs.max_resp_len`; the SFT config's `SFT_KEY_EQUALS`) are
accepted only at the value of the key they stand for (an interpolation in them resolved first, in our config or else
in the user's own file). verl's keys that hybridrl has no use for are dropped where they hold verl's default
(`verl_defaults.py`, one table for the PPO config, one for the SFT config: a copy of verl's full generated config or
of its sft_trainer.yaml loads), named in one warning; verl's nulls for "not set" (`verl_defaults.UNSET_WHEN_NULL`) keep
our default. The deprecated global micro-batch keys
(`ppo_micro_batch_size`, `log_prob_micro_batch_size`) are converted to their `_per_gpu` form by dividing by
the data-parallel size, as verl does; setting both forms is an error.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybridrl.config.errors import ConfigError
from hybridrl.config.lora_adapter import with_lora_adapter
from hybridrl.config.schema import (
    ALIAS_NOTES,
    ALIASES,
    CONFIG_DIR,
    check_schema,
    key_equals,
    key_renames,
    load_defaults,
    unknown_hint,
)
from hybridrl.config.sections import ROOTS, PPOConfig, Section
from hybridrl.config.verl_defaults import UNSET_WHEN_NULL, check_served_reward_model, drop_verl_key, grouped
from hybridrl.dotted import dotted_leaves

__all__ = ["load_config", "load_defaults", "parse_override", "Override", "CONFIG_DIR"]

log = logging.getLogger("hybridrl.config")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_MISSING = object()


@dataclass(frozen=True)
class Override:
    kind: str  # "set" | "add" | "force"
    key: str
    value: Any


def _fix_floats(v: Any) -> Any:
    # PyYAML (YAML 1.1) reads `1e-6` as a string; every verl user writes learning rates that way
    if isinstance(v, str) and _FLOAT.fullmatch(v):
        return float(v)
    if isinstance(v, list):
        return [_fix_floats(x) for x in v]
    if isinstance(v, dict):
        return {k: _fix_floats(x) for k, x in v.items()}
    return v


def parse_override(text: str) -> Override:
    """`a.b=1` / `+a.b=1` / `++a.b=1` -> Override; the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    kind = "force" if key.startswith("++") else "add" if key.startswith("+") else "set"
    key = key.lstrip("+").strip()
    if not sep or not key:
        raise ConfigError([f"override {text!r} must look like key=value (or +key=value to add a key)"])
    if key.startswith("~"):
        raise ConfigError([f"override {text!r}: deleting keys (~key) is not supported; set the key to null"])
    if raw == "":
        return Override(kind, key, "")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw  # e.g. an unbalanced bracket inside a path: keep the text as given
    return Override(kind, key, _fix_floats(value))


def _free_dict_prefix(key: str, schema: dict) -> str | None:
    """The free dict (default `{}`) that `key` lies inside, if any."""
    node, parts = schema, key.split(".")
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
        if node == {}:
            return ".".join(parts[: i + 1])
    return None


def _apply_override(cfg: DictConfig, ov: Override, schema: dict, root: str = "ppo_trainer") -> None:
    exists = OmegaConf.select(cfg, ov.key, default=_MISSING, throw_on_resolution_failure=False) is not _MISSING
    free = _free_dict_prefix(ov.key, schema)
    if ov.kind == "set" and not exists:
        msg = f"override '{ov.key}={ov.value}': unknown key '{ov.key}'"
        msg += unknown_hint(ov.key, _siblings(ov.key, schema), _leaf_paths(schema), root)
        if free:
            msg += f" (to add a key under the free dict '{free}', write +{ov.key}=...)"
        raise ConfigError([msg])
    if ov.kind == "add" and exists and not free:
        log.warning("config: +%s sets a key that exists here (verl's recipes add it to a base config that lacks it)",
                    ov.key)
    if not exists and not free:
        frees = [p for p in _leaf_paths(schema) if _node(schema, p) == {}]
        raise ConfigError([f"override '+{ov.key}': keys can be added only inside free dicts {frees}; "
                           f"'{ov.key}' is not in the schema" + unknown_hint(ov.key, _siblings(ov.key, schema),
                                                                               _leaf_paths(schema), root)])
    OmegaConf.update(cfg, ov.key, ov.value, merge=False, force_add=True)


def _leaf_paths(tree: dict, prefix: str = "") -> list[str]:
    """Every key of a plain tree, sections included (free dicts, `{}`, are keys)."""
    out = []
    for k, v in tree.items():
        out.append(f"{prefix}{k}")
        if isinstance(v, dict) and v:
            out += _leaf_paths(v, f"{prefix}{k}.")
    return out


def _siblings(key: str, schema: dict) -> list[str]:
    parent, _, _ = key.rpartition(".")
    node = _node(schema, parent) if parent else schema
    return [f"{parent}.{k}" if parent else k for k in node] if isinstance(node, dict) else []


def _node(tree: dict, path: str):
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _expand_dotted(tree: dict, where: str) -> dict:
    """{'a.b': 1} -> {'a': {'b': 1}}; the same leaf given twice with different values is an error."""
    out: dict = {}
    for key, value in tree.items():
        value = _expand_dotted(value, where) if isinstance(value, dict) else value
        parts = str(key).split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError([f"{where}: key '{key}' goes inside '{part}', which is also set to a value"])
        last = parts[-1]
        if last in node and isinstance(node[last], dict) and isinstance(value, dict):
            node[last] = _deep_merge(node[last], value, key, where)
        elif last in node and node[last] != value:
            raise ConfigError([f"{where}: key '{key}' is given twice ({node[last]!r} and {value!r})"])
        else:
            node[last] = value
    return out


def _deep_merge(a: dict, b: dict, key: str, where: str) -> dict:
    out = dict(a)
    for k, v in b.items():
        if k in out and isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = _deep_merge(out[k], v, f"{key}.{k}", where)
        elif k in out and out[k] != v:
            raise ConfigError([f"{where}: key '{key}.{k}' is given twice ({out[k]!r} and {v!r})"])
        else:
            out[k] = v
    return out


def _read_user_yaml(config_file: str | Path) -> dict:
    path = Path(config_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(config_file)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError([f"config file {str(path)!r} is not valid YAML: {e}"]) from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"config file {str(path)!r} must hold a mapping of sections, got {type(data).__name__}"])
    return _fix_floats(_expand_dotted(data, f"config file {str(path)!r}"))


def _renamed(key: str, root: str) -> str:
    """`key` with a verl spelling of its prefix (schema.key_renames of the config `root`) replaced by ours, logged."""
    for old, new in key_renames(root).items():
        if key == old or key.startswith(old + "."):
            ours = new + key[len(old):]
            log.warning("config: %s is read as %s (verl's spelling)", key, ours)
            return ours
    return key


def _dropped(key: str, value: Any, schema: dict, dropped: list[str], served: list[tuple[str, Any, str]],
             source: str, root: str) -> bool:
    """Whether a user's `key` = `value` is left out before merging: a verl key that is none of ours (nor inside a
    free dict of ours) and that `verl_defaults.drop_verl_key` drops (by the table of the config `root`)."""
    if _node(schema, key) is not None or _free_dict_prefix(key, schema) is not None:
        return False
    return drop_verl_key(key, value, dropped, served, source, root)


def _verl_spellings(tree: dict, source: str, equals: list[tuple[str, Any, str]], schema: dict,
                    dropped: list[str], served: list[tuple[str, Any, str]], root: str) -> dict:
    """A user YAML tree with verl's spellings (schema.key_renames) moved to our keys, schema.key_equals taken out into
    `equals` (key, value, source) for the check after resolution, and `_dropped` keys left out (recorded in
    `dropped`). Of a key given in both spellings, a null yields to the other's value (verl's generated config nulls the
    deprecated spelling)."""
    flat: dict = {}
    spelled: dict[str, str] = {}   # our key -> the key the file gave it under
    for key, value in dotted_leaves(tree).items():
        if key in key_equals(root):
            equals.append((key, value, source))
            continue
        ours = _renamed(key, root)
        if _dropped(ours, value, schema, dropped, served, source, root):
            continue
        if ours in flat and value is None:
            continue
        if ours in flat and flat[ours] is not None and flat[ours] != value:
            given = {key: value, spelled[ours]: flat[ours]}   # one spelling is ours, the other verl's
            verl = key if key != ours else spelled[ours]
            raise ConfigError([f"{source}: '{ours}' is given twice, as {given[ours]!r} and (as verl's '{verl}') "
                               f"{given[verl]!r}; keep one"])
        flat[ours], spelled[ours] = value, key
    return _expand_dotted(flat, source)


def _canonical(key: str, value: Any) -> Any:
    """`value` of `key` with verl's spelling (schema.ALIASES, e.g. strategy fsdp) read as ours."""
    return ALIASES.get(key, {}).get(value, value) if isinstance(value, str) else value


def _resolved(value: Any, key: str, cfg: DictConfig, user_tree: dict) -> Any:
    """`value` of the verl key `key` with an interpolation in it resolved: against the resolved config with the
    value placed at `key` (`${actor_rollout_ref.actor.strategy}`), else within the user's own file (verl's relative
    `${.save_contents}`, a key read under another name here); as given where neither resolves it."""
    if not (isinstance(value, str) and "${" in value):
        return value
    for tree in (cfg, OmegaConf.create(user_tree)):
        probe = OmegaConf.create(OmegaConf.to_container(tree, resolve=False))
        try:
            OmegaConf.update(probe, key, value, merge=False, force_add=True)
            found = OmegaConf.select(probe, key)
        except OmegaConfBaseException:
            continue
        return OmegaConf.to_container(found) if isinstance(found, DictConfig | ListConfig) else found
    return value


def _check_equals(cfg: DictConfig, equals: list[tuple[str, Any, str]], user_tree: dict, root: str) -> None:
    errors = []
    for key, value, source in equals:
        target, rule = key_equals(root)[key]
        value = _resolved(value, key, cfg, user_tree)
        want = OmegaConf.select(cfg, target)
        if _canonical(target, value) != _canonical(target, want):
            errors.append(f"{source}: '{key}' = {value!r} must equal '{target}' = {want!r}: {rule}")
    if errors:
        raise ConfigError(errors)


def _apply_aliases(cfg: DictConfig) -> None:
    for key, table in ALIASES.items():
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str) and value in table:
            note = ALIAS_NOTES.get(key, "hybridrl's engine for that role")
            log.warning("config: %s=%s is read as %s=%s: %s", key, value, key, table[value], note)
            OmegaConf.update(cfg, key, table[value], merge=False)


def _normalize_micro_batches(cfg: DictConfig, user_keys: set[str]) -> None:
    """verl's deprecated global micro-batch keys -> per-GPU keys (global // data-parallel size)."""
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    sp = cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size
    if world <= 0 or sp <= 0 or world % sp:
        return  # PPOConfig.validate reports it
    pairs = [("actor_rollout_ref.actor.ppo_micro_batch_size", world // sp),
             ("actor_rollout_ref.rollout.log_prob_micro_batch_size", world // sp),
             ("actor_rollout_ref.ref.log_prob_micro_batch_size", world // sp),
             ("critic.ppo_micro_batch_size", world), ("reward_model.micro_batch_size", world)]
    errors = []
    for key, dp in pairs:
        total = OmegaConf.select(cfg, key)
        if total is None:
            continue
        per_gpu_key = f"{key}_per_gpu"
        if per_gpu_key in user_keys and OmegaConf.select(cfg, per_gpu_key) is not None:
            errors.append(f"'{key}' = {total} and '{per_gpu_key}' = {OmegaConf.select(cfg, per_gpu_key)} are both set; "
                          f"set only one ('{key}' is the deprecated global form)")
        elif total <= 0 or total % dp:
            errors.append(f"'{key}' = {total} must be a positive multiple of the data-parallel size {dp}")
        else:
            log.warning("config: %s=%d (deprecated) is read as %s=%d (divided by dp=%d)", key, total, per_gpu_key,
                        total // dp, dp)
            OmegaConf.update(cfg, per_gpu_key, total // dp, merge=False)
            OmegaConf.update(cfg, key, None, merge=False)
    if errors:
        raise ConfigError(errors)


def load_config(config_file: str | Path | None = None, overrides: tuple[str, ...] | list[str] = (),
                defaults: str = "ppo_trainer", validate: bool = True) -> Section:
    """Merge defaults, `config_file` and `overrides`, resolve interpolations, validate (ConfigError) and build the
    typed config once: a PPOConfig for ppo_trainer, an SFTConfig for sft_trainer (`config.sections.ROOTS`)."""
    cfg = load_defaults(defaults)
    schema = OmegaConf.to_container(cfg, resolve=True)
    user_keys: set[str] = set()
    equals: list[tuple[str, Any, str]] = []   # verl keys that must equal one of ours (schema.key_equals)
    dropped: list[str] = []   # verl's keys at verl's defaults (verl_defaults.py: the table of `defaults`), left out
    served: list[tuple[str, Any, str]] = []   # SERVED_REWARD_MODEL keys, settled after resolution
    user_tree: dict = {}
    if config_file is not None:
        user_tree = _read_user_yaml(config_file)
        user = _verl_spellings(user_tree, f"config file {str(config_file)!r}", equals, schema, dropped, served,
                               defaults)
        user_keys |= set(_leaf_paths(user))
        try:
            cfg = OmegaConf.merge(cfg, user)
        except OmegaConfBaseException as e:
            raise ConfigError([f"config file {str(config_file)!r} does not merge with the defaults: {e}"]) from e
    errors: list[str] = []
    spelled: dict[str, tuple[str, Any]] = {}   # our key -> (the override that set it, value), for renamed keys
    for text in overrides:  # every bad override is reported, not only the first
        try:
            ov = parse_override(text)
            if ov.key in key_equals(defaults):
                equals.append((ov.key, ov.value, f"override {text!r}"))
                continue
            ours = _renamed(ov.key, defaults)
            if _dropped(ours, ov.value, schema, dropped, served, f"override {text!r}", defaults):
                continue
            earlier = spelled.get(ours)
            if earlier is not None and earlier[0] != ov.key and earlier[1] != ov.value:
                raise ConfigError([f"override {text!r}: '{ours}' is also set by {earlier[0]}={earlier[1]!r} "
                                   f"(one of the two is verl's spelling of it); keep one"])
            spelled[ours] = (ov.key, ov.value)
            if ours != ov.key:   # verl adds these keys (+key=...); ours exist: set them
                ov = Override("set", ours, ov.value)
            user_keys.add(ov.key)
            _apply_override(cfg, ov, schema, root=defaults)
        except ConfigError as e:
            errors += e.errors
        except OmegaConfBaseException as e:
            errors.append(f"override {text!r} cannot be applied: {e}")
    if errors:
        raise ConfigError(errors)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError([f"interpolation failed at '{getattr(e, 'full_key', '?')}': {e}"]) from e
    for key in UNSET_WHEN_NULL:  # verl's null (also through its interpolations) = not set: our default
        if OmegaConf.select(cfg, key, default=_MISSING) is None:
            OmegaConf.update(cfg, key, _node(schema, key), merge=False)
            user_keys.discard(key)   # not set: verl's deprecated global micro-batch key may still give it
    if dropped:
        verb = "is" if len(dropped) == 1 else "are"
        log.warning("config: %d of verl's keys %s at verl's defaults, which ask for nothing hybridrl does not do, "
                    "and %s left out: %s", len(dropped), verb, verb, grouped(dropped))
        log.info("config: the verl keys left out: %s", ", ".join(dropped))
    _check_equals(cfg, equals, user_tree, defaults)
    check_served_reward_model(cfg, served)
    _apply_aliases(cfg)
    root = ROOTS[defaults]
    if not validate:
        return root.from_dict(OmegaConf.to_container(cfg, resolve=True))
    if defaults == "ppo_trainer":  # its registrations (policy losses, estimators) are valid config values
        from hybridrl.models.external_lib import ExternalLibError, import_external_lib

        try:
            import_external_lib(OmegaConf.select(cfg, "actor_rollout_ref.model.external_lib"))
        except ExternalLibError as e:
            raise ConfigError([str(e)]) from e
    check_schema(OmegaConf.to_container(cfg, resolve=True), root)
    if defaults == "ppo_trainer":
        _normalize_micro_batches(cfg, user_keys)
    typed = root.from_dict(OmegaConf.to_container(cfg, resolve=True))
    if isinstance(typed, PPOConfig):
        typed = with_lora_adapter(typed)   # the adapter's own LoRA keys, before the rules and the plan read them
        for w in typed.validate():
            log.warning("config: %s", w)
    return typed
