"""Rewrites config/verl/{ppo,sft}_trainer_defaults.yaml (verl_defaults.py's tables) from verl's config directory:

    python -m hybridrl.config.verl_defaults_table VERL/verl/trainer/config

(the PPO table from `_generated_ppo_trainer.yaml`, the SFT table from `sft_trainer.yaml` composed with its
`defaults` list, `optim: fsdp`), then name verl's commit in each table's header.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from hybridrl.config.schema import key_equals, key_renames, load_defaults
from hybridrl.config.verl_defaults import TABLES

__all__ = ["sft_config_from", "table_from"]

SFT_HEADER = """\
# verl's SFT trainer keys that hybridrl's SFT schema does not have, at verl's default values: the flattened leaves of
# volcengine/verl verl/trainer/config/sft_trainer.yaml composed with its defaults list (optim: fsdp) (commit b178a3cd,
# Apache-2.0) outside hybridrl's SFT keys and its renames (schema.SFT_KEY_RENAMES). hybridrl/config/verl_defaults.py
# reads this file for the SFT config as the PPO table for the PPO config: a key at exactly this value is dropped and
# named in one warning; any other value is refused, naming the key (schema.SFT_REFUSED says why where it can).
# Regenerate: python -m hybridrl.config.verl_defaults_table VERL/verl/trainer/config (then edit the commit above)."""


def table_from(verl_config: dict, schema: dict, root: str = "ppo_trainer") -> dict[str, Any]:
    """The table's rows from verl's config (nested) and our defaults tree of `root` (nested, unresolved): every leaf
    whose key, read through our renames, is not one of our keys and not inside one of our free dicts."""
    from hybridrl.dotted import dotted_leaves

    ours: set[str] = set()
    free: set[str] = set()

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            ours.add(prefix + k)
            if isinstance(v, dict):
                if v:
                    walk(v, f"{prefix}{k}.")
                else:
                    free.add(prefix + k)

    walk(schema, "")
    renames, equals = key_renames(root), key_equals(root)

    def renamed(key: str) -> str:
        return next((new + key[len(old):] for old, new in renames.items()
                     if key == old or key.startswith(old + ".")), key)

    return {key: value for key, value in dotted_leaves(verl_config).items()
            if renamed(key) not in ours and key not in equals
            and not any(renamed(key).startswith(f + ".") for f in free)}


def sft_config_from(config_dir: Path) -> dict:
    """verl's SFT config as its defaults list composes it: optim/fsdp.yaml under `optim`, then the file's own keys."""
    own = yaml.safe_load((config_dir / "sft_trainer.yaml").read_text())
    optim = yaml.safe_load((config_dir / "optim" / "fsdp.yaml").read_text())
    return {**own, "optim": {**optim, **own.get("optim", {})}}


def _write(root: str, table: dict, header: str) -> None:
    with open(TABLES[root], "w") as f:
        f.write(header + "\n")
        yaml.safe_dump(table, f, sort_keys=False, default_flow_style=None, width=200)
    print(f"{TABLES[root]}: {len(table)} keys")


def _main(argv: list[str]) -> int:
    from omegaconf import OmegaConf

    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m hybridrl.config.verl_defaults_table VERL/verl/trainer/config", file=sys.stderr)
        return 2
    config_dir = Path(argv[0])
    verl_ppo = yaml.safe_load((config_dir / "_generated_ppo_trainer.yaml").read_text())
    ppo_header = "\n".join(line for line in TABLES["ppo_trainer"].read_text().splitlines() if line.startswith("#"))
    _write("ppo_trainer", table_from(verl_ppo, OmegaConf.to_container(load_defaults(), resolve=False)), ppo_header)
    sft_schema = OmegaConf.to_container(load_defaults("sft_trainer"), resolve=False)
    _write("sft_trainer", table_from(sft_config_from(config_dir), sft_schema, "sft_trainer"), SFT_HEADER)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
