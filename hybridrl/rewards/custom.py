"""Loading a user's reward function from a Python file (`custom_reward_function.path` / `.name`).

Returns a `CustomRewardFunction`: callable, and picklable as (path, name, reward kwargs) so the reward manager's
scorer worker process can load the same file again (a function imported from an arbitrary path cannot be pickled by
reference). The file is imported and the function checked at construction, so a wrong path or name fails at
startup, not at the first reward. As in verl (`get_custom_reward_fn`): `reward_kwargs` are merged into every call and
win over the call's own keywords, and an `async def` function (verl's reward loop awaits them) is run to completion
on an event loop of its own, so it scores like a plain one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from hybridrl.awaiting import resolved

__all__ = ["CustomRewardFunction", "import_from_file", "load_custom_reward_function"]


def import_from_file(path: Path, name: str, key: str = "custom_reward_function"):
    """`name` from the Python file at `path`; errors name `{key}.path` / `{key}.name`."""
    module_name = f"hybridrl_{key.replace('.', '_')}_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{key}.path={str(path)!r}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise ValueError(f"{key}.path={str(path)!r}: importing it failed: {e!r}") from e
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"{key}.name={name!r}: no such name in {str(path)!r}")
    if not callable(fn):
        raise ValueError(f"{key}.name={name!r} in {str(path)!r} is not callable")
    return fn


class CustomRewardFunction:
    def __init__(self, path: str | Path, name: str = "compute_score", reward_kwargs: dict | None = None):
        self.path = Path(path).expanduser().resolve()
        self.name = name
        self.reward_kwargs = dict(reward_kwargs or {})
        if not self.path.is_file():
            raise FileNotFoundError(f"custom_reward_function.path={str(path)!r}: file not found")
        self._fn = import_from_file(self.path, name)

    def __call__(self, *args, **kwargs):
        return resolved(self._fn(*args, **{**kwargs, **self.reward_kwargs}))

    @property
    def function(self):
        """The loaded function itself (its signature says whether it takes `rm_score`)."""
        return self._fn

    def __getstate__(self):
        return {"path": str(self.path), "name": self.name, "reward_kwargs": self.reward_kwargs}

    def __setstate__(self, state):
        self.__init__(state["path"], state["name"], state.get("reward_kwargs"))

    def __repr__(self) -> str:
        return f"CustomRewardFunction({str(self.path)!r}, {self.name!r})"


def load_custom_reward_function(path: str | Path | None, name: str = "compute_score",
                                reward_kwargs: dict | None = None) -> CustomRewardFunction | None:
    """None when path is None (use the default scorer); otherwise the loaded function, with `reward_kwargs` bound."""
    if path is None:
        return None
    return CustomRewardFunction(path, name or "compute_score", reward_kwargs)
