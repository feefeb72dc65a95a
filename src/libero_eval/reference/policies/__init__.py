"""Server-side policies of the reference server, by name.

To add one, implement :class:`ServerPolicy` in its own module, import it here and add
``Class.name: Class`` to ``SERVER_POLICIES``.
"""

from __future__ import annotations

from typing import Any

from libero_eval.reference.policies.base import PolicyItem, ServerPolicy
from libero_eval.reference.policies.hold import HoldPolicy
from libero_eval.reference.policies.scripted import ScriptedExpertPolicy

SERVER_POLICIES: dict[str, type[ServerPolicy]] = {
    HoldPolicy.name: HoldPolicy,
    ScriptedExpertPolicy.name: ScriptedExpertPolicy,
}


def server_policy_class(name: str) -> type[ServerPolicy]:
    """The policy class registered as ``name``; ``ValueError`` listing the names otherwise."""
    try:
        return SERVER_POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown server policy {name!r}; choose one of {sorted(SERVER_POLICIES)} "
            "(registered in libero_eval/reference/policies/__init__.py)"
        ) from None


def make_server_policy(name: str, **kwargs: Any) -> ServerPolicy:
    """Instantiate the server policy registered as ``name`` with ``kwargs``."""
    return server_policy_class(name)(**kwargs)


__all__ = [
    "SERVER_POLICIES",
    "HoldPolicy",
    "ScriptedExpertPolicy",
    "PolicyItem",
    "ServerPolicy",
    "make_server_policy",
    "server_policy_class",
]
