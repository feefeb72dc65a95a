"""The config as written, before it is read: the config's own families registered, the seed's
layout upgraded (with a deprecation naming the old and the new key), settings of another family
refused, then the schema's check with its defaults filled in. Every error is a `ConfigError`
naming the field and the fix; `libero_eval.config` reads the checked config.

The seed's layout (the project's first configs, ``config/config.yaml`` and its first SGLang
config as first written; tests/fixtures/seed_configs) still works: its request knobs
``policy.http_*`` (:data:`MOVED_TO_FAILURES`), its family's fields directly under ``policy``
(that family's ``Family.upgrade``) and its statistics file under ``config/stats/``
(:data:`SEED_FILES`). No other older layout is read: a key in a place the schema does not have
is refused by the schema, naming the field and, where a field of that name lives elsewhere,
its place."""

from __future__ import annotations

import warnings
from pathlib import Path
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


# policy.<old key> -> rollout.failures.<new key>: the seed's request knobs, moved under the one
# section of failure settings (issue 26)
MOVED_TO_FAILURES = {
    "http_timeout_s": "request_timeout_s",
    "http_max_retries": "request_retries",
    "http_retry_backoff_s": "retry_backoff_s",
}


# A file the seed shipped under config/ -> the same file, shipped in the package since
# (`libero_eval.package_data`): the seed's configs name it so.
SEED_FILES = {
    "config/stats/libero_native_frame_wise_relative_rot6d.json": (
        "libero_eval:stats/libero_native_frame_wise_relative_rot6d.json"
    ),
}


def move_seed_files(config: Any, path: str = "") -> list[str]:
    """A value naming a file the seed shipped (:data:`SEED_FILES`) that is not there read as
    the packaged file, with a deprecation naming the field and both names. Returns the
    messages."""
    messages = []
    items = config.items() if isinstance(config, dict) else ()
    for key, value in list(items):
        field = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict):
            messages += move_seed_files(value, field)
        elif isinstance(value, str) and value in SEED_FILES and not Path(value).exists():
            config[key] = SEED_FILES[value]
            messages.append(
                f"{field}: {value} is the seed's copy of a file now shipped in the package; "
                f"read as {SEED_FILES[value]}: write that"
            )
    return messages


def move_failure_fields(config: dict[str, Any]) -> list[str]:
    """Read ``policy.http_*`` (the seed's, before issue 26) as ``rollout.failures.*``, with a
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
    """Register the config's own families (``policy.family_modules``), upgrade the seed's
    layout (:func:`move_failure_fields`, each family's ``Family.upgrade``,
    :func:`move_seed_files`) and reject settings of another model family; call BEFORE schema
    validation fills defaults (the schema gives every field a default, so this runs on the
    config as written).

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
    deprecations += move_seed_files(config)
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
