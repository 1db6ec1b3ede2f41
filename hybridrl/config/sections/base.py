"""The base of every config section: a frozen dataclass built once from its part of the loaded YAML tree.

A field's annotation is its type (`int`, `float`, `str | None`, `Literal[...]` for allowed values, a `Section`
subclass for a nested section, `dict` for a free dict handed on to HF configs) and the string right below it is its
documentation (docs/config.md is generated from both). The packaged YAML holds the defaults; a test keeps its keys
and the fields equal.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from functools import cache
from typing import Any, Literal, get_args, get_origin

__all__ = ["Section", "field_docs", "field_types", "members", "type_name"]


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section. Attribute access as in the YAML (`cfg.actor_rollout_ref.rollout.n`)."""

    @classmethod
    def from_dict(cls, tree: dict) -> Section:
        """The section of a validated tree (its keys are the fields; nested sections are built too). An int stays
        an int where a float is expected (as in Python's typing: `1` for `1.0`), so messages show values as given."""
        return cls(**{name: _build(ann, tree[name]) for name, ann in field_types(cls).items()})

    def to_dict(self) -> dict:
        """The plain tree (nested dicts and lists), e.g. to save or compare a resolved config."""
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The config as YAML, keys in their declaration order (what `hybridrl config show` prints)."""
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(self.to_dict())

    def with_value(self, path: str, value: Any) -> Section:
        """A copy with the key at dotted `path` (e.g. "actor.optim.total_training_steps") set to `value`."""
        name, _, rest = path.partition(".")
        return dataclasses.replace(self, **{name: getattr(self, name).with_value(rest, value) if rest else value})


@cache
def field_types(cls: type[Section]) -> dict[str, Any]:
    """Field name -> resolved annotation, in declaration order (the YAML's)."""
    hints = typing.get_type_hints(cls, include_extras=False)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@cache
def field_docs(cls: type[Section]) -> dict[str, str]:
    """Field name -> the string literal right below its declaration (in `cls` or the Section it extends), its lines
    joined (fields without one are left out)."""
    docs = {}
    for owner in reversed([c for c in cls.__mro__ if issubclass(c, Section) and c is not Section]):
        body = ast.parse(textwrap.dedent(inspect.getsource(owner))).body[0].body
        for stmt, after in zip(body, body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value,
                                                                                            ast.Constant):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def members(ann: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation (`int | None` -> (int, NoneType)); else (ann,)."""
    if get_origin(ann) in (typing.Union, types.UnionType):
        return get_args(ann)
    return (ann,)


def _build(ann: Any, value: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, Section):
        return ann.from_dict(value)
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _member_name(m: Any) -> str:
    if get_origin(m) is Literal:
        return type(get_args(m)[0]).__name__
    if get_origin(m) is list:
        return "list"
    return m.__name__


def type_name(ann: Any) -> str:
    """How messages and the docs name a type: `int`, `str | bool`, `list` (None left out)."""
    names = [_member_name(m) for m in members(ann) if m is not type(None)]
    return " | ".join(dict.fromkeys(names))
