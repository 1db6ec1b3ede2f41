"""`actor_rollout_ref.model.external_lib`: a module the user names to register custom HF model classes
(`AutoConfig.register`, `AutoModelForCausalLM.register`), imported in the driver and in every worker process
before any model or HF config is built there, as verl does."""

from __future__ import annotations

import importlib

__all__ = ["ExternalLibError", "import_external_lib"]

KEY = "actor_rollout_ref.model.external_lib"


class ExternalLibError(ImportError):
    """The configured external library cannot be imported."""


def import_external_lib(name: str | None):
    """Import `name` (a dotted module path; None or "" = nothing to do) and return the module."""
    if not name:
        return None
    try:
        return importlib.import_module(name)
    except Exception as e:  # a module that fails while importing is as unusable as a missing one
        raise ExternalLibError(f"{KEY}={name!r} cannot be imported ({type(e).__name__}: {e}); it must be an "
                               "importable module path (installed, or on PYTHONPATH in the driver and workers)") from e
