"""Tools written as classes with verl's BaseTool interface, driven the way verl's tool agent loop drives them.

Duck-typed: nothing here imports verl. A class qualifies when it has `create` and `execute` methods; one instance
is built when the tool config is loaded, with `(config, tool_schema)`, `config` being the entry's `config` mapping
and `tool_schema` a `SchemaView` of the entry's `tool_schema` (attribute access like verl's pydantic
OpenAIFunctionToolSchema: `.function.name`, `.function.parameters.properties["x"].type`; `model_dump()` gives the
mapping back). Each call is one session on an event loop of its own, in the call's thread:
`create(instance_id=<unique>, create_kwargs=<the sample's or {}>)` (its return, an id or `(id, response)`, names the
instance), `execute(instance_id, arguments)` (a `(response, reward, metrics)` tuple, or a bare response; the
response a ToolResponse-like object whose `.text` is used, None being "", or a str), then `release(instance_id)`,
however execute ended. Methods may be coroutines or plain functions.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import numbers
from uuid import uuid4

__all__ = ["RULE", "SchemaView", "build_instance", "has_verl_interface", "run_session"]

RULE = ("a tool class needs verl's BaseTool interface: methods create(instance_id=None, **kwargs) and "
        "execute(instance_id, parameters, **kwargs) (release(instance_id) is called when present); "
        "a plain tool is a function taking the arguments as keywords and returning a str")

# fields verl's pydantic schema models default when the YAML leaves them out
_SCHEMA_DEFAULTS = {"description": None, "enum": None, "strict": False}


class SchemaView:
    """A read-only view of a tool schema mapping: keys as attributes (nested mappings as views, recursively) and as
    items, plus pydantic's `model_dump()`/`model_dump_json()`, which verl tools call on their `tool_schema`."""

    __slots__ = ("_data",)

    def __init__(self, data: dict):
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name: str):
        data = object.__getattribute__(self, "_data")
        if name in data:
            return _view(data[name])
        if name in _SCHEMA_DEFAULTS:
            return _SCHEMA_DEFAULTS[name]
        raise AttributeError(f"tool schema has no field {name!r} (has {sorted(data)})")

    def __setattr__(self, name, value):
        raise AttributeError("the tool schema is read-only")

    def __getitem__(self, key):
        return _view(self._data[key])

    def __contains__(self, key) -> bool:
        return key in self._data

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key, default=None):
        return _view(self._data[key]) if key in self._data else default

    def keys(self):
        return self._data.keys()

    def values(self):
        return [_view(v) for v in self._data.values()]

    def items(self):
        return [(k, _view(v)) for k, v in self._data.items()]

    def model_dump(self, **_kwargs) -> dict:
        return copy.deepcopy(self._data)

    def model_dump_json(self, **_kwargs) -> str:
        return json.dumps(self._data)

    def __eq__(self, other) -> bool:
        return isinstance(other, SchemaView) and other._data == self._data

    __hash__ = None

    def __repr__(self) -> str:
        return f"SchemaView({self._data!r})"


def _view(value):
    if isinstance(value, dict):
        return SchemaView(value)
    if isinstance(value, list):
        return [_view(v) for v in value]
    return value


def has_verl_interface(cls) -> bool:
    return callable(getattr(cls, "create", None)) and callable(getattr(cls, "execute", None))


def build_instance(cls, config: dict, schema: dict, where: str, class_name: str):
    """The one instance of a verl-style tool class, as verl builds it; ValueError naming the entry otherwise."""
    if not has_verl_interface(cls):
        missing = [m for m in ("create", "execute") if not callable(getattr(cls, m, None))]
        raise ValueError(f"{where}: class_name={class_name!r} is the class {cls.__qualname__}, which has no "
                         f"{' and no '.join(missing)} method: {RULE}")
    try:
        return cls(copy.deepcopy(config), SchemaView(copy.deepcopy(schema)))
    except Exception as e:
        raise ValueError(f"{where}: class_name={class_name!r}: {cls.__qualname__}(config, tool_schema) raised "
                         f"{type(e).__name__}: {e}") from e


async def _resolve(value):
    return await value if inspect.isawaitable(value) else value


def _text(response) -> str:
    if response is None:
        return ""
    if isinstance(response, str):
        return response
    if hasattr(response, "text"):
        return "" if response.text is None else str(response.text)
    return str(response)


def _reward(value) -> float | None:
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


async def _session(tool, name: str, arguments: dict, create_kwargs: dict) -> tuple[str, str, float | None]:
    instance_id = f"{name}-{uuid4().hex}"
    created = await _resolve(tool.create(instance_id=instance_id, create_kwargs=create_kwargs))
    created = created[0] if isinstance(created, tuple) and created else created
    if created is not None:
        instance_id = created
    release = getattr(tool, "release", None)
    try:
        result = await _resolve(tool.execute(instance_id, arguments))
    except BaseException:  # raised or cancelled (timeout): the instance is released all the same
        if callable(release):
            try:
                await _resolve(release(instance_id))
            except Exception:
                pass  # the execute error is the one reported
        raise
    response, reward = (result[0] if result else None, result[1] if len(result) > 1 else None) \
        if isinstance(result, tuple) else (result, None)
    text = _text(response)
    status = "error" if text.startswith("Error:") else "ok"
    if callable(release):
        try:
            await _resolve(release(instance_id))
        except Exception:  # the answer stands (the model sees it), the failure is counted as a crash
            status = "crash"
    return text, status, _reward(reward)


def run_session(tool, name: str, arguments: dict, create_kwargs: dict | None,
                timeout_s: float) -> tuple[str, str, float | None]:
    """One create/execute/release session -> (text, status, step reward or None); raises what the tool raised.

    Runs on an event loop of its own (the caller's thread). An async execute still running after `timeout_s` is
    cancelled and its instance released; a blocking one is left to the caller's thread guard."""
    async def main():
        task = asyncio.ensure_future(_session(tool, name, dict(arguments), dict(create_kwargs or {})))
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # lets the session release its instance
            return f"Error: the tool did not answer within {timeout_s:g}s", "timeout", None
        return task.result()

    return asyncio.run(main())
