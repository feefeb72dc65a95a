"""The reference server's settings (:class:`ReferenceServerSettings`): those of the server
itself, which every family's part shares (its server policy, the batching and latency model,
a slow start, the model name it reports), the family it serves, and that family's own settings,
which the family's part of the server takes (``Family.reference``; its fields of
``server.reference``; docs/rfcs/0009-family-plug-ins.md). Each is checked against its
``server.reference`` schema, defaults filled in from it."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from types import ModuleType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from libero_eval import settings_schema
from libero_eval.policy import families

# The config's `server.reference` defaults (the schema's): the server's own where it has them.
CONFIG = settings_schema.defaults("server", "reference")
FAMILY = settings_schema.default("policy", "family")
SECTION = ("server", "reference")


def _setting(default: Any = MISSING, help: str = "", flag: str | None = None, **kw: Any) -> Any:
    """A settings field with its command-line help (and flag, where it is not ``--<name>``)."""
    metadata = {"help": help, **({"flag": flag} if flag else {})}
    if "default_factory" in kw:
        return field(default_factory=kw["default_factory"], metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class ReferenceServerSettings:
    """How the reference server behaves; see ``python -m libero_eval.reference.server -h``.

    The one list of the server's settings: its command-line flags (:func:`add_arguments`,
    :func:`from_arguments`) and the argv the serve job writes (:func:`to_argv`) are derived
    from these fields. The fields of the config's `server.reference` section take their
    defaults from the schema (:data:`CONFIG`), which writes them once (the server runs on its
    own too, so it has defaults); tests/test_settings_defined_once.py checks them. The
    family's own settings (``family_settings``) are its fields of `server.reference`, built
    into its part's ``Settings`` (:attr:`family_part_settings`)."""

    policy: str = _setting(CONFIG["policy"], f"server policy name (default {CONFIG['policy']})")
    max_batch_size: int = _setting(
        CONFIG["max_batch_size"], "largest batch computed at once, like --batching-max-size"
    )
    latency_fixed_s: float = _setting(
        CONFIG["latency_fixed_s"], "latency model: fixed seconds per batch"
    )
    latency_per_item_s: float = _setting(
        CONFIG["latency_per_item_s"], "latency model: seconds per observation"
    )
    startup_delay_s: float = _setting(
        CONFIG["startup_delay_s"], "a slow start: /health answers 503 this long (seconds)"
    )
    # None: reference-<policy>, as the serve job names it
    model_name: str | None = _setting(None, "reported model name (default reference-<policy>)")
    family: str = _setting(
        FAMILY, f"policy family whose API to serve (default {FAMILY}, policy.family's)"
    )
    # None: a built-in or installed family (the registry finds it)
    family_module: str | None = _setting(
        None, "the module that registers the family (one of policy.family_modules)"
    )
    family_settings: Mapping[str, Any] = _setting(
        help="JSON object of the family's own settings (its fields of server.reference; "
        "default {}: the schema's defaults)",
        default_factory=dict,
    )
    policy_kwargs: Mapping[str, Any] = _setting(
        help="JSON object of keyword arguments for the policy constructor (default {})",
        default_factory=dict,
    )

    def __post_init__(self) -> None:
        if self.model_name is None:
            object.__setattr__(self, "model_name", f"reference-{self.policy}")
        # `policy` is any registered server policy (reference/policies, checked when the
        # server is made); the config's schema lists those it ships
        checked = set(settings_schema.reference_fields()) - {"policy"}
        _raise_schema_errors({name: getattr(self, name) for name in checked})
        part = families.reference_server(self.family, self.family_module)
        built = family_settings(part.Settings, self.family, self.family_settings)
        object.__setattr__(self, "_family_part", (part, built))

    @property
    def family_part(self) -> ModuleType:
        """The family's part of the server (``Family.reference.module``)."""
        return self._family_part[0]  # type: ignore[attr-defined]

    @property
    def family_part_settings(self) -> Any:
        """The family's own settings, its part's ``Settings`` built from ``family_settings``."""
        return self._family_part[1]  # type: ignore[attr-defined]


def family_settings(cls: type, family: str, values: Mapping[str, Any]) -> Any:
    """The family part's settings dataclass ``cls`` from ``values`` (its fields of
    `server.reference`; a path may be a ``Path``), checked against their schema, each field
    left out at its schema default."""
    given = dataclasses.asdict(values) if dataclasses.is_dataclass(values) else dict(values)
    given = {k: str(v) if isinstance(v, Path) else v for k, v in given.items()}
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ValueError(
            f"family_settings: {unknown} are not settings of family {family!r}'s part of the "
            f"reference server; its settings are {sorted(names)}"
        )
    _raise_schema_errors(given)
    return settings_schema.build(cls, *SECTION, **given)


def _raise_schema_errors(values: Mapping[str, Any]) -> None:
    """``ValueError`` naming each value that breaks its `server.reference` schema."""
    as_config = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
    errors = settings_schema.shared_errors(as_config, *SECTION)
    if errors:
        raise ValueError("; ".join(errors))


def flag_of(setting: Field) -> str:
    """A setting's command-line flag: ``--<name with dashes>`` unless it names its own."""
    return setting.metadata.get("flag") or "--" + setting.name.replace("_", "-")


def setting_types() -> dict[str, type]:
    """Each setting's value type (``Path | None`` -> Path, a mapping -> dict)."""
    kinds: dict[str, type] = {}
    for name, hint in get_type_hints(ReferenceServerSettings).items():
        if get_origin(hint) in (Union, UnionType):
            hint = next(arg for arg in get_args(hint) if arg is not type(None))
        kinds[name] = dict if (get_origin(hint) or hint) in (Mapping, dict) else hint
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`ReferenceServerSettings` field, with its default and help."""
    types = setting_types()
    for setting in fields(ReferenceServerSettings):
        kind = types[setting.name]
        kwargs: dict[str, Any] = {"dest": setting.name, "help": setting.metadata["help"]}
        if kind is dict:
            kwargs.update(type=_json_object(flag_of(setting)), default={})
        else:
            kwargs["type"] = kind
            if setting.default is MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = setting.default
        parser.add_argument(flag_of(setting), **kwargs)


def _json_object(flag: str) -> Any:
    def parse(text: str) -> dict[str, Any]:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object, got {text!r}")
        return value

    return parse


def from_arguments(args: argparse.Namespace) -> ReferenceServerSettings:
    """The settings from flags parsed by a parser that :func:`add_arguments` filled."""
    return ReferenceServerSettings(
        **{setting.name: getattr(args, setting.name) for setting in fields(ReferenceServerSettings)}
    )


def to_argv(values: Mapping[str, Any]) -> list[str]:
    """The flags for ``values`` (setting name -> value; None or absent: the server's default),
    in field order."""
    argv: list[str] = []
    for setting in fields(ReferenceServerSettings):
        value = values.get(setting.name)
        if value is not None:
            text = json.dumps(value) if isinstance(value, Mapping) else str(value)
            argv += [flag_of(setting), text]
    return argv
