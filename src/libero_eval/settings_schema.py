"""The config schema (``libero_eval/data/schema.yaml``, package data), read once: the one
place a config field's name, type and default are written. Code that needs a default (an
adapter built without a validated config, the report given a partial config) takes it from here
rather than writing it again."""

from __future__ import annotations

import copy
import dataclasses
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import yaml

from libero_eval import package_data

# src/libero_eval/data/schema.yaml in the repository (Snakemake's `validate` reads it there)
SCHEMA_PATH: Path = package_data.path("schema.yaml")
T = TypeVar("T")


@cache
def schema() -> dict[str, Any]:
    """The JSON schema of a run config (the workflow validates with it and fills defaults)."""
    return yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))


def add_policy_family(
    name: str, fragment: dict[str, Any] | None = None, reference: dict[str, Any] | None = None
) -> None:
    """A registered policy family in the schema (``libero_eval.policy.families``): ``name``
    among ``policy.family``'s choices, ``fragment`` (where given) as its section
    ``policy.<name>``, and ``reference`` (where given: field name -> its schema) as the fields
    it adds to ``server.reference``, the settings of its part of the reference server. Adding
    the same family again changes nothing; a ``server.reference`` field another family added
    is refused."""
    policy = schema()["properties"]["policy"]
    if fragment is not None and name not in policy["properties"]:
        policy["properties"][name] = copy.deepcopy(dict(fragment))
    known = section("server", "reference")["properties"]
    for field, spec in (reference or {}).items():
        owner = _REFERENCE_OWNERS.get(field, name if field not in known else None)
        if owner != name:
            raise ValueError(
                f"family {name!r} adds server.reference.{field}, which "
                f"{'family ' + repr(owner) if owner else 'the reference server'} has: "
                "name the family's field otherwise"
            )
        _REFERENCE_OWNERS[field] = name
        known.setdefault(field, copy.deepcopy(dict(spec)))
    choices = policy["properties"]["family"].setdefault("enum", [])
    if name not in choices:
        choices.append(name)
    _shared_validator.cache_clear()
    _validator.cache_clear()


# server.reference field -> the family that added it (add_policy_family)
_REFERENCE_OWNERS: dict[str, str] = {}


def family_reference_fields(name: str) -> tuple[str, ...]:
    """The fields family ``name`` added to ``server.reference``, in the schema's order."""
    return tuple(f for f in fields("server", "reference") if _REFERENCE_OWNERS.get(f) == name)


def reference_fields() -> tuple[str, ...]:
    """The fields of ``server.reference`` no family added: the reference server's own."""
    return tuple(f for f in fields("server", "reference") if f not in _REFERENCE_OWNERS)


def validate(config: dict[str, Any]) -> None:
    """Check ``config`` against the schema (with every registered family's section) and fill
    in the defaults, in place, as Snakemake's ``validate`` does; ``ValueError`` names the
    field of each bad value."""
    errors = sorted(_validator().iter_errors(config), key=lambda e: [str(p) for p in e.path])
    if errors:
        raise ValueError("; ".join(_message(error) for error in errors))


def _message(error: jsonschema.ValidationError) -> str:
    """``field: what is wrong`` and what the field is (its description, config/README.md)."""
    field = ".".join(map(str, error.absolute_path)) or "config"
    about = error.schema.get("description") if isinstance(error.schema, dict) else None
    return f"{field}: {error.message}" + (f" ({field}: {' '.join(about.split())})" if about else "")


@cache
def _validator() -> jsonschema.protocols.Validator:
    """A validator that fills in defaults as it descends (jsonschema's recipe, as Snakemake's
    ``validate(..., set_default=True)``)."""
    cls = jsonschema.validators.validator_for(schema())
    check_properties = cls.VALIDATORS["properties"]

    def fill(validator, properties, instance, node):  # type: ignore[no-untyped-def]
        if isinstance(instance, dict):
            for name, spec in properties.items():
                if "default" in spec:
                    instance.setdefault(name, copy.deepcopy(spec["default"]))
        yield from check_properties(validator, properties, instance, node)

    return jsonschema.validators.extend(cls, {"properties": fill})(schema())


def section(*path: str) -> dict[str, Any]:
    """The schema of the config object at ``path``, e.g. ``section("policy", "pi05")``."""
    node = schema()
    for name in path:
        node = node["properties"][name]
    return node


def fields(*path: str) -> tuple[str, ...]:
    """The field names of the config object at ``path``, in the schema's order."""
    return tuple(section(*path)["properties"])


def choices(*path: str) -> dict[str, tuple[Any, ...]]:
    """Each field of the config object at ``path`` that the schema restricts to an ``enum``,
    with its allowed values in the schema's order."""
    return {
        name: tuple(spec["enum"])
        for name, spec in section(*path)["properties"].items()
        if "enum" in spec
    }


def defaults(*path: str) -> dict[str, Any]:
    """Each field of the config object at ``path`` with its schema default (a fresh copy)."""
    return {
        name: copy.deepcopy(spec.get("default"))
        for name, spec in section(*path)["properties"].items()
    }


def default(*path: str) -> Any:
    """The schema default of the field at ``path``, e.g. ``default("report", "decimals")`` (a
    fresh copy): what a function parameter or a settings field that stands for a config field
    takes, so the value is written once, in the schema."""
    *parent, name = path
    return copy.deepcopy(section(*parent)["properties"][name]["default"])


def build(cls: type[T], *path: str, **values: Any) -> T:
    """The dataclass ``cls``, a projection of the config object at ``path`` (its fields that
    the schema has carry no default of their own), with ``values`` and each of those fields
    not in ``values`` at its schema default: ``build(EnvSettings, "rollout", reset_mode="hard")``
    is what a config that sets only ``rollout.reset_mode`` gives."""
    known = section(*path)["properties"]
    filled = {
        f.name: default(*path, f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name in known and f.name not in values
    }
    return cls(**filled, **values)


# The schema's mark of a field that changes no episode's outcome (JSON Schema ignores `x-` keys).
FINGERPRINT_KEY = "x-fingerprint"


def outcome_neutral(*path: str) -> tuple[str, ...]:
    """The fields under the config object at ``path`` that the schema marks
    ``x-fingerprint: false`` (no outcome depends on them), as dotted paths relative to it, in the
    schema's order: ``outcome_neutral("rollout")`` has ``"envs_per_shard"``; a marked section
    stands for all of its fields."""

    def walk(node: dict[str, Any], prefix: str) -> list[str]:
        found = []
        for name, spec in node.get("properties", {}).items():
            if spec.get(FINGERPRINT_KEY) is False:
                found.append(prefix + name)
            elif "properties" in spec:
                found += walk(spec, f"{prefix}{name}.")
        return found

    return tuple(walk(section(*path), ""))


def without_outcome_neutral(data: dict[str, Any], *path: str) -> dict[str, Any]:
    """``data``, the config object at ``path``, without the fields :func:`outcome_neutral`
    names (a shallow copy; nested sections copied where a field of theirs goes)."""
    kept = dict(data)
    for dotted in outcome_neutral(*path):
        *parents, name = dotted.split(".")
        node = kept
        for parent in parents:
            if not isinstance(node.get(parent), dict):
                break
            node[parent] = node = dict(node[parent])
        else:
            node.pop(name, None)
    return kept


def _shared(node: dict[str, Any], nullable: bool = False) -> dict[str, Any]:
    """``node`` for a mapping that carries some of its fields beside fields of its own: each
    field it has is checked as the config's, no field is required, others are left alone, and
    a nested section may be null (a slot's settings leave out the other backends')."""
    if "properties" not in node:
        return node
    return {
        "type": ["object", "null"] if nullable else "object",
        "properties": {name: _shared(spec, True) for name, spec in node["properties"].items()},
    }


@cache
def _shared_validator(path: tuple[str, ...]) -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema())
    return cls(_shared(section(*path)))


def shared_errors(data: Any, *path: str, where: str | None = None) -> list[str]:
    """Where ``data`` breaks the schema of the config object at ``path``, one message per bad
    value naming its field (``server.port: 70000 is greater than the maximum of 65535``), in
    field order; empty when none. Only the fields ``data`` shares with the config are checked
    (the serve job's settings carry the `server` section's fields beside ``slot``,
    ``gpu_id``, ...), each against its own subschema. ``where`` names ``data`` in the messages
    (default: the dotted ``path``)."""
    errors = _shared_validator(path).iter_errors(data)
    return [
        f"{'.'.join([where or '.'.join(path), *map(str, error.absolute_path)])}: {error.message}"
        for error in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])
    ]
