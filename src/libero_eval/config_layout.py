"""The config as written, before it is read: the config's own families registered, an older
layout upgraded (with a deprecation naming the old and the new key), settings of another family
refused, then the schema's check with its defaults filled in. Every error is a `ConfigError`
naming the field and the fix; `libero_eval.config` reads the checked config."""

from __future__ import annotations

import warnings
from typing import Any

from libero_eval import settings_schema
from libero_eval.policy import families


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field and the fix."""


class ConfigDeprecationWarning(FutureWarning):
    """A config key of an older layout, still read; the message names the old and new key."""


def family_fields(family: str) -> tuple[str, ...]:
    """The fields of ``policy.<family>``, as the schema lists them."""
    families.names()  # the registered families' sections are in the schema
    return settings_schema.fields("policy", family)


# policy.<old key> -> rollout.failures.<new key>: the request knobs moved under the one section
# of failure settings (issue 26)
MOVED_TO_FAILURES = {
    "http_timeout_s": "request_timeout_s",
    "http_max_retries": "request_retries",
    "http_retry_backoff_s": "retry_backoff_s",
}


def move_failure_fields(config: dict[str, Any]) -> list[str]:
    """Read ``policy.http_*`` (the layout before issue 26) as ``rollout.failures.*``, with a
    deprecation message naming the old and the new key; where both are set, the old key wins
    (as for a family's older layout, `Family.upgrade`). Returns the messages."""
    policy = config.get("policy")
    if not isinstance(policy, dict) or not any(key in policy for key in MOVED_TO_FAILURES):
        return []
    rollout = config.setdefault("rollout", {})
    if not isinstance(rollout, dict) or not isinstance(rollout.get("failures", {}), dict):
        return []  # the schema reports it
    failures = rollout.setdefault("failures", {})
    moved = [key for key in MOVED_TO_FAILURES if key in policy]
    for key in moved:
        failures[MOVED_TO_FAILURES[key]] = policy.pop(key)
    return [
        f"{', '.join('policy.' + key for key in moved)}: deprecated, read as "
        f"{', '.join('rollout.failures.' + MOVED_TO_FAILURES[key] for key in moved)}. "
        "Every failure setting now lives under rollout.failures: move them there"
    ]


def check_family_fields(config: dict[str, Any]) -> list[str]:
    """Register the config's own families (``policy.family_modules``), upgrade an older layout
    (``move_failure_fields`` too) and reject settings of another model family; call BEFORE
    schema validation fills defaults (the schema gives every field a default, so this runs on
    the config as written).

    Each family's settings are under ``policy.<family>``. A family whose settings once sat
    elsewhere moves them there (``Family.upgrade``) with a :class:`ConfigDeprecationWarning`
    naming the old and the new key. Returns the warnings' messages (the workflow prints them).
    """
    try:
        families.load_config_modules(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    deprecations = move_failure_fields(config)
    policy = config.get("policy") or {}
    if not isinstance(policy, dict):
        return []  # the schema reports it
    family = policy.get("family", settings_schema.default("policy", "family"))
    for name in families.names():
        upgrade = families.get(name).upgrade
        try:
            deprecations += upgrade(policy) if upgrade is not None else []
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    foreign = [name for name in families.names() if name != family and name in policy]
    if foreign:
        other = families.get(foreign[0])
        mine = families.get(family) if family in families.names() else None
        where = f" (see {mine.example_config})" if mine and mine.example_config else ""
        raise ConfigError(
            f"policy.{other.name}: {other.title} settings, but policy.family is {family}. "
            f"Remove them, or set policy.family: {other.name} (and drop policy.{family}); "
            f"{family}'s settings go under policy.{family}{where}. Are two configs of "
            "different families stacked with --configfile?"
        )
    for message in deprecations:
        warnings.warn(message, ConfigDeprecationWarning, stacklevel=2)
    return deprecations


def validate_config(config: dict[str, Any]) -> None:
    """The config checked against the schema (every registered family's section included)
    with its defaults filled in, in place; after :func:`check_family_fields`."""
    families.names()  # the registered families' sections are in the schema
    try:
        settings_schema.validate(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
