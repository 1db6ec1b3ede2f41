"""Configuration: packaged default YAML (verl key names), loading with overrides into the typed config (frozen
section dataclasses, `sections/`, which hold each key's type, documentation and rules), validation (the run's device
layout and shape are the plan's: hybridrl/plan/layout.py, hybridrl/plan/shape.py)."""

from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config, load_defaults
from hybridrl.config.validate import validate_config

__all__ = ["ConfigError", "load_config", "load_defaults", "validate_config"]
