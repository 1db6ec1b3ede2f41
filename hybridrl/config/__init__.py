"""Configuration: packaged default YAML (verl key names), loading with overrides, validation, device layout."""

from hybridrl.config.layout import Layout, derive_layout
from hybridrl.config.loader import load_config, load_defaults
from hybridrl.config.validate import ConfigError, validate_config

__all__ = ["ConfigError", "Layout", "derive_layout", "load_config", "load_defaults", "validate_config"]
