"""verl's registries: advantage estimators and policy losses looked up by name, extendable by users.

`@register_adv_est("name")` / `@register_policy_loss("name")` add a function; registering a different function
under a taken estimator name is an error (as in verl), a policy loss of the same name is replaced (as in verl).
`get_adv_estimator_fn` / `get_policy_loss_fn` raise ValueError naming the unknown name and the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

__all__ = ["ADV_ESTIMATOR_REGISTRY", "POLICY_LOSS_REGISTRY", "get_adv_estimator_fn", "get_policy_loss_fn",
           "register_adv_est", "register_policy_loss"]

ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable] = {}


def _name(name_or_enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(name_or_enum):
    def decorator(fn):
        name = _name(name_or_enum)
        if ADV_ESTIMATOR_REGISTRY.get(name, fn) is not fn:
            raise ValueError(f"register_adv_est: estimator {name!r} is already registered as "
                             f"{ADV_ESTIMATOR_REGISTRY[name].__qualname__}; pick another name")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum) -> Callable:
    name = _name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(f"algorithm.adv_estimator={name!r} is not supported; valid: {sorted(ADV_ESTIMATOR_REGISTRY)}")
    return ADV_ESTIMATOR_REGISTRY[name]


def register_policy_loss(name: str):
    def decorator(fn):
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable:
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"actor.policy_loss.loss_mode={name!r} is not supported; valid: {sorted(POLICY_LOSS_REGISTRY)}")
    return POLICY_LOSS_REGISTRY[name]
