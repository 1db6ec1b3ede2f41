"""`actor_rollout_ref.model.lora_adapter_path`: a saved peft adapter that the actor's LoRA starts from.

The adapter's own configuration decides the run's LoRA keys (verl loads it with `PeftModel.from_pretrained`, which
ignores lora_rank and friends): `with_lora_adapter` reads adapter_config.json once, when the config is loaded, and
writes its rank, alpha and targets into the typed config, so the run plan, `config check` and the workers all see
them. The weights are loaded into the injected adapters before sharding (training/lora.py
`load_adapter_weights`).

Refused, naming the key and the file: a directory without adapter_config.json or adapter weights, an adapter type
other than LoRA, DoRA, trained biases, targets the actor cannot adapt, and a lora_rank > 0 that differs from the
adapter's r. An adapter's dropout is logged and not applied: the actor's adapters run without dropout so that the
old and the update's log-probs agree.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from hybridrl.config.errors import ConfigError

__all__ = ["KEY", "adapter_lora_keys", "with_lora_adapter"]

KEY = "actor_rollout_ref.model.lora_adapter_path"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
log = logging.getLogger("hybridrl.config")


def adapter_lora_keys(path: str) -> dict:
    """{lora_rank, lora_alpha, target_modules, target_parameters, exclude_modules} of the adapter directory `path` (the value of
    KEY), read from its adapter_config.json; ConfigError naming KEY, the file and the rule when it cannot be used."""
    where = Path(os.path.expanduser(path))
    config_file = where / "adapter_config.json"
    if not config_file.is_file():
        raise ConfigError([f"'{KEY}' = {path!r}: no adapter_config.json there (a peft adapter directory: "
                           "adapter_config.json + adapter_model.safetensors, as `hybridrl merge` writes for a LoRA "
                           "checkpoint)"])
    if not any((where / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError([f"'{KEY}' = {path!r}: no adapter weights ({' or '.join(WEIGHT_FILES)}) beside "
                           "adapter_config.json"])
    try:
        cfg = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError([f"'{KEY}': {str(config_file)!r} is not JSON ({e})"]) from e
    problems = []
    if cfg.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type {cfg.get('peft_type')!r} (only LoRA adapters)")
    if cfg.get("use_dora"):
        problems.append("use_dora true (DoRA adapters are not supported)")
    if cfg.get("bias", "none") != "none":
        problems.append(f"bias {cfg.get('bias')!r} (trained biases are not supported: bias must be 'none')")
    if not isinstance(cfg.get("r"), int) or cfg["r"] <= 0:
        problems.append(f"r {cfg.get('r')!r} (a positive integer)")
    if problems:
        raise ConfigError([f"'{KEY}' = {path!r}: {str(config_file)!r} has {p}" for p in problems])
    targets = cfg.get("target_modules")
    targets = "all-linear" if targets in ("all-linear", None) else (
        [targets] if isinstance(targets, str) else sorted(targets))
    if cfg.get("lora_dropout"):
        log.warning("config: the adapter at %s was trained with lora_dropout=%s; the actor's adapters run without "
                    "dropout (the old and the update's log-probs must agree)", path, cfg["lora_dropout"])
    exclude = cfg.get("exclude_modules")
    return {"lora_rank": cfg["r"], "lora_alpha": cfg.get("lora_alpha", 8), "target_modules": targets,
            "target_parameters": sorted(cfg["target_parameters"]) if cfg.get("target_parameters") else None,
            "exclude_modules": sorted(exclude) if isinstance(exclude, list | tuple | set) else exclude}


def with_lora_adapter(config):
    """`config` (a typed PPOConfig) with the LoRA keys of its adapter, where KEY is set; else `config` itself."""
    model = config.actor_rollout_ref.model
    if model.lora_adapter_path is None:
        return config
    keys = adapter_lora_keys(model.lora_adapter_path)
    if model.lora_rank not in (0, keys["lora_rank"]):
        raise ConfigError([f"'actor_rollout_ref.model.lora_rank' = {model.lora_rank} but the adapter at '{KEY}' = "
                           f"{model.lora_adapter_path!r} has r = {keys['lora_rank']}: leave lora_rank at 0 (the "
                           "adapter's rank is taken) or set it to the adapter's"])
    for name, value in keys.items():
        config = config.with_value(f"actor_rollout_ref.model.{name}", value)
    log.warning("config: the actor's LoRA starts from the adapter at %s: lora_rank=%s, lora_alpha=%s, "
                "target_modules=%s, target_parameters=%s, exclude_modules=%s", model.lora_adapter_path, *keys.values())
    return config
