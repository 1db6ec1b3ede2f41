"""verl-like entry point: `python -m hybridrl.trainer.main_ppo [--config F] key=value ...`.

Loads and validates the config on the driver (so a bad batch size fails in a second, before Ray or any
worker starts), prints the device layout, then hands over to `hybridrl.trainer.launch.run_ppo`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from omegaconf import DictConfig

from hybridrl.config.layout import derive_layout
from hybridrl.config.loader import load_config
from hybridrl.config.validate import ConfigError, validate_config


def run(config: DictConfig):
    """Validate (errors only; load_config already logged warnings), print the layout, train."""
    validate_config(config)
    derive_layout(config)  # batch arithmetic fails here, in a second; the run plan is printed once Ray is up
    from hybridrl.trainer.launch import run_ppo

    return run_ppo(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridrl.trainer.main_ppo")
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config (nested, verl key names)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
