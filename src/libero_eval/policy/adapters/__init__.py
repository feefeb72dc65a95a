"""Model-family adapters: one module per family, registered in :data:`ADAPTERS`."""

from __future__ import annotations

from typing import Any

from libero_eval.policy.adapters.base import Observation, PolicyAdapter
from libero_eval.policy.adapters.cosmos3 import Cosmos3Adapter
from libero_eval.policy.adapters.pi05 import Pi05Adapter

ADAPTERS: dict[str, type[PolicyAdapter]] = {
    Cosmos3Adapter.family: Cosmos3Adapter,
    Pi05Adapter.family: Pi05Adapter,
}


def make_adapter(family: str, settings: dict[str, Any]) -> PolicyAdapter:
    """Instantiate the adapter registered for ``family`` (``policy.family``) with ``settings``."""
    try:
        adapter_class = ADAPTERS[family]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown policy.family {family!r}; known families: {sorted(ADAPTERS)}. "
            "A new family is a PolicyAdapter subclass registered in "
            "libero_eval.policy.adapters.ADAPTERS"
        ) from None
    return adapter_class(settings)


__all__ = [
    "ADAPTERS",
    "Cosmos3Adapter",
    "Observation",
    "Pi05Adapter",
    "PolicyAdapter",
    "make_adapter",
]
