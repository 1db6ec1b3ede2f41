"""Rewrites config/verl/ppo_trainer_defaults.yaml (verl_defaults.py's table) from verl's generated PPO config:

    python -m hybridrl.config.verl_defaults_table VERL/verl/trainer/config/_generated_ppo_trainer.yaml

then name verl's commit in the table's header.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from hybridrl.config.schema import KEY_EQUALS, KEY_RENAMES, load_defaults
from hybridrl.config.verl_defaults import TABLE

__all__ = ["table_from"]


def table_from(verl_config: dict, schema: dict) -> dict[str, Any]:
    """The table's rows from verl's generated config (nested) and our defaults tree (nested, unresolved): every leaf
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

    def renamed(key: str) -> str:
        return next((new + key[len(old):] for old, new in KEY_RENAMES.items()
                     if key == old or key.startswith(old + ".")), key)

    return {key: value for key, value in dotted_leaves(verl_config).items()
            if renamed(key) not in ours and key not in KEY_EQUALS
            and not any(renamed(key).startswith(f + ".") for f in free)}


def _main(argv: list[str]) -> int:
    from omegaconf import OmegaConf

    if len(argv) != 1:
        print("usage: python -m hybridrl.config.verl_defaults_table VERL/_generated_ppo_trainer.yaml", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        verl_config = yaml.safe_load(f)
    table = table_from(verl_config, OmegaConf.to_container(load_defaults(), resolve=False))
    header = [line for line in TABLE.read_text().splitlines() if line.startswith("#")]
    with open(TABLE, "w") as f:
        f.write("\n".join(header) + "\n")
        yaml.safe_dump(table, f, sort_keys=False, default_flow_style=None, width=200)
    print(f"{TABLE}: {len(table)} keys")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
