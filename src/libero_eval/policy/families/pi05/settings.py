"""``policy.pi05`` as the adapter takes it: checked against its schema (``schema.yaml`` beside
this file, package data, with the field π0.5 adds to ``server.reference``; merged into the
config schema when the package is imported, so that its modules read it before the registry
registers the family; the same check as the config's, for an adapter built without one), the
schema's defaults filled in; and the rule for a value the checkpoint decides (:func:`agree`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from libero_eval import settings_schema
from libero_eval.policy.families import load_schema
from libero_eval.policy.families.pi05.checkpoint import Pi05Layout

POLICY, REFERENCE = load_schema(__package__, "pi05")
PATH = ("policy", "pi05")

# policy.pi05's fields restricted to a list of values, as its schema.yaml lists them (once).
CHOICES: dict[str, tuple[Any, ...]] = settings_schema.choices(*PATH)
# policy.pi05's fields and defaults, as its schema.yaml writes them (once).
DEFAULTS: dict[str, Any] = settings_schema.defaults(*PATH)


def checked(settings: dict[str, Any]) -> dict[str, Any]:
    """``policy.pi05`` (``settings``, or its ``pi05`` entry) with every field, each value
    checked against the schema; ``ValueError`` naming each bad or unknown field."""
    if not isinstance(settings, dict):
        raise ValueError(f"policy settings must be a mapping, got {type(settings).__name__}")
    block = settings.get("pi05", settings)
    if not isinstance(block, dict):
        raise ValueError(f"policy.pi05 must be a mapping, got {type(block).__name__}")
    unknown = sorted(set(block) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown π0.5 setting(s) {', '.join('policy.pi05.' + k for k in unknown)}; "
            f"known: {sorted(DEFAULTS)}"
        )
    merged = {**DEFAULTS, **block}
    errors = settings_schema.shared_errors(merged, *PATH)
    if errors:
        raise ValueError("; ".join(errors))
    return merged


def agree(name: str, configured: Any, derived: Any, layout: Pi05Layout) -> Any:
    """The checkpoint's value; a configured one that contradicts it is refused, naming both."""
    if configured is None or configured == derived:
        return derived
    raise ValueError(
        f"policy.pi05.{name} is {configured!r} but the checkpoint says {derived!r} "
        f"({layout.describe()}). Remove policy.pi05.{name} (the checkpoint decides) or use "
        "the checkpoint it was meant for"
    )


def same_path(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()
