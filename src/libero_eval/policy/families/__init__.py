"""Model-family adapters: one module per family, found here by its ``ADAPTER`` entry.

Every module of this package that defines ``ADAPTER`` (a :class:`PolicyAdapter` subclass with
its ``family``) is registered in :data:`ADAPTERS` under that family; adding a family adds no
line here.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from libero_eval.policy.adapters.base import Observation, PolicyAdapter


def _discover() -> dict[str, type[PolicyAdapter]]:
    found: dict[str, type[PolicyAdapter]] = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        entry = getattr(importlib.import_module(f"{__name__}.{module.name}"), "ADAPTER", None)
        if entry is None:
            continue
        if entry.family in found:
            raise RuntimeError(
                f"two adapter modules claim policy.family {entry.family!r}: "
                f"{found[entry.family].__module__} and {entry.__module__}"
            )
        found[entry.family] = entry
    return found


ADAPTERS: dict[str, type[PolicyAdapter]] = _discover()


def make_adapter(family: str, settings: dict[str, Any]) -> PolicyAdapter:
    """Instantiate the adapter registered for ``family`` (``policy.family``) with ``settings``."""
    try:
        adapter_class = ADAPTERS[family]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown policy.family {family!r}; known families: {sorted(ADAPTERS)}. "
            "A new family is a module in libero_eval/policy/adapters/ whose ADAPTER is its "
            "PolicyAdapter subclass"
        ) from None
    return adapter_class(settings)


__all__ = ["ADAPTERS", "Observation", "PolicyAdapter", "make_adapter"]
