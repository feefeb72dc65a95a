"""The config schema (``libero_eval/data/schema.yaml``, package data), read once, and the one
validator: the one place a config field's name, type, bounds and default are written, and the
one check of a value against them.

:func:`validate` checks a whole config (and fills in its defaults, as Snakemake's ``validate``
does); :func:`load` builds a settings dataclass from a mapping of its fields (a config section,
or a job's settings that carry a section's fields beside their own), checked against the
section's subschema with its defaults filled, and runs the class's cross-field rules. Every
error names the field (``section.field``) and what is wrong, in jsonschema's words. Code that
needs a default (an adapter built without a validated config, the report given a partial
config) takes it from here rather than writing it again."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping
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
    clear_caches()


# server.reference field -> the family that added it (add_policy_family)
_REFERENCE_OWNERS: dict[str, str] = {}


def family_reference_fields(name: str) -> tuple[str, ...]:
    """The fields family ``name`` added to ``server.reference``, in the schema's order."""
    return tuple(f for f in fields("server", "reference") if _REFERENCE_OWNERS.get(f) == name)


def reference_fields() -> tuple[str, ...]:
    """The fields of ``server.reference`` no family added: the reference server's own."""
    return tuple(f for f in fields("server", "reference") if f not in _REFERENCE_OWNERS)


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


# --- the one validator -------------------------------------------------------------------------


def validate(config: dict[str, Any]) -> None:
    """Check ``config`` against the schema (with every registered family's section) and fill
    in the defaults, in place, as Snakemake's ``validate`` does; ``ValueError`` names the
    field of each bad value."""
    problems = messages(config, schema())
    if problems:
        raise ValueError("; ".join(problems))


def messages(data: Any, node: dict[str, Any], where: str = "", fill: bool = True) -> list[str]:
    """Where ``data`` breaks the schema ``node`` (filling in its defaults, in place, with
    ``fill``): one message per bad value naming its field (``where``: the dotted path of
    ``data``), in field order; empty when none."""
    filling, plain = _validator_classes()
    validator = (filling if fill else plain)(node)
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    return list(dict.fromkeys(text for error in errors for text in _messages(error, where)))


def shared_errors(data: Mapping[str, Any], *path: str, where: str | None = None) -> list[str]:
    """Where the fields ``data`` shares with the config object at ``path`` break their
    subschemas (:func:`messages`, no defaults filled): what a settings object that carries
    some of a section's fields beside its own (a family's part of the reference server, an
    adapter's settings) checks of them."""
    known = section(*path).get("properties", {})
    shared = {key: value for key, value in data.items() if key in known}
    node = {"type": "object", "properties": {key: known[key] for key in shared}}
    return messages(shared, node, ".".join(path) if where is None else where, fill=False)


@cache
def _validator_classes() -> tuple[Any, Any]:
    """The schema's validator class (its ``$schema`` draft), and that class filling in defaults
    as it descends (jsonschema's recipe, as Snakemake's ``validate(..., set_default=True)``)."""
    cls = jsonschema.validators.validator_for(schema())
    check_properties = cls.VALIDATORS["properties"]

    def fill(validator, properties, instance, node):  # type: ignore[no-untyped-def]
        if isinstance(instance, dict):
            for name, spec in properties.items():
                if "default" in spec:
                    instance.setdefault(name, copy.deepcopy(spec["default"]))
        yield from check_properties(validator, properties, instance, node)

    return jsonschema.validators.extend(cls, {"properties": fill}), cls


def _dotted(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def _messages(error: jsonschema.ValidationError, where: str) -> list[str]:
    """``field: what is wrong`` and what the field is (its description, config/README.md); a
    missing field and an unknown one are each named with their own path."""
    field = _dotted(where, *map(str, error.absolute_path))
    node = error.schema if isinstance(error.schema, dict) else {}
    known = node.get("properties", {})
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        return [
            f"{_dotted(field, name)}: required but missing" + _about(known.get(name), field, name)
            for name in missing
        ]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        return [_unexpected(field, name, known) for name in error.instance if name not in known]
    return [f"{field or 'config'}: {error.message}" + _about(node, field)]


def _about(spec: Any, *path: str) -> str:
    """`` (field: its description)``, or nothing for a field without one."""
    about = spec.get("description") if isinstance(spec, dict) else None
    field = _dotted(*path) or "config"
    return f" ({field}: {' '.join(about.split())})" if about else ""


def _unexpected(field: str, name: str, known: Mapping[str, Any]) -> str:
    """An unknown field named, with where it may belong: a field of that name elsewhere in
    the schema (a setting written in an older or another place), a close name, or the fields
    there are."""
    owner = field or "the config"
    text = f"{_dotted(field, name)}: '{name}' was unexpected: {owner} has no such field"
    elsewhere = [path for path in _places(name) if path != _dotted(field, name)]
    close = difflib.get_close_matches(name, list(known), n=3)
    if len(elsewhere) == 1:
        return f"{text}; {elsewhere[0]} is a field of that name: move it there"
    if elsewhere:
        return f"{text}; fields of that name: {', '.join(elsewhere)} (move it to the one meant)"
    if close:
        return f"{text}; did you mean {' or '.join(_dotted(field, c) for c in close)}?"
    return f"{text}; its fields are {', '.join(known)}"


def _places(name: str, node: dict[str, Any] | None = None, prefix: str = "") -> list[str]:
    """The dotted config fields named ``name``, anywhere in the schema."""
    node = schema() if node is None else node
    found = []
    for key, spec in node.get("properties", {}).items():
        if key == name:
            found.append(prefix + key)
        if isinstance(spec, dict) and "properties" in spec:
            found += _places(name, spec, f"{prefix}{key}.")
    return found


# --- the loader: a settings dataclass from a mapping of its fields ------------------------------

# A dataclass field's metadata: the JSON schema of a field that is no config field (a job's own,
# e.g. the serve job's `slot`), and what builds its value once checked (`field_schema`).
SCHEMA_KEY = "schema"
BUILD_KEY = "build"
# A cross-field rule (what no one field's subschema can say): (settings, the dotted name they
# have in messages) -> what is wrong, naming the fields and the fix, or None. A settings class
# lists its rules in ``RULES``; each is a named function whose docstring states the rule.
Rule = Callable[[Any, str], "str | None"]


def field_schema(
    spec: dict[str, Any] | Callable[[], dict[str, Any]], build: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """The metadata of a settings field that is no config field
    (``field(metadata=field_schema({...}))``): ``spec``, its JSON schema (or what makes it),
    and ``build``, what makes the field's value of the checked one (a mapping into an
    object)."""
    return {SCHEMA_KEY: spec, **({BUILD_KEY: build} if build is not None else {})}


def load(
    cls: type[T],
    data: Any,
    *,
    section: tuple[str, ...] | None = None,
    where: str | None = None,
    error: type[ValueError] = ValueError,
) -> T:
    """The settings dataclass ``cls`` from ``data``, the mapping of its fields.

    ``data`` (a copy) is checked against :func:`class_schema` (each field that the config
    section ``cls`` projects has, ``cls.SECTION`` or ``section``, against the section's
    subschema; each other field against its own) and the section's defaults are filled in;
    then each field takes its value (a nested settings dataclass built the same way, an
    integer of a ``float`` field as a float, a list of a tuple field as a tuple) and the
    class's cross-field ``RULES`` run on the result. ``error`` (a ``ValueError``) names every
    bad field as ``where.field`` (``where``: the dotted section by default)."""
    path = _section_of(cls, section)
    where = ".".join(path) if where is None else where
    checked = copy.deepcopy(dict(data)) if isinstance(data, Mapping) else data
    problems = messages(checked, class_schema(cls, path), where)
    if problems:
        raise error("; ".join(problems))
    return _build(cls, checked, where, error)


def checked(
    data: Any, *path: str, where: str | None = None, error: type[ValueError] = ValueError
) -> dict[str, Any]:
    """The config object at ``path`` as a mapping: a copy of ``data`` checked against the
    section's subschema, with its defaults filled in (what code that takes a section as a
    mapping, e.g. a family's adapter built without a validated config, reads); ``error``
    names every bad field as ``where.field`` (``where``: the dotted ``path`` by default)."""
    where = ".".join(path) if where is None else where
    value = copy.deepcopy(dict(data)) if isinstance(data, Mapping) else data
    problems = messages(value, section(*path), where)
    if problems:
        raise error("; ".join(problems))
    return value


def build(cls: type[T], *path: str, **values: Any) -> T:
    """``cls`` with ``values`` and each other field of the section at ``path`` at its default:
    ``build(EnvSettings, "rollout", reset_mode="hard")`` is what a config that sets only
    ``rollout.reset_mode`` gives (:func:`load`, so a bad value is refused as in a config)."""
    return load(cls, values, section=path)


@cache
def class_schema(cls: type, path: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The JSON schema of the mapping of ``cls``'s fields. A field of the config section at
    ``path`` (``cls.SECTION`` by default) has the section's subschema; a nested settings
    dataclass, its own (nullable where the field's default is None); another field, the
    schema its metadata gives (none: any value, a field typed in Python only). No other key
    is allowed; a field with neither a schema default nor a Python default is required."""
    path = _section_of(cls, path)
    known = section(*path)["properties"] if path else {}
    properties: dict[str, Any] = {}
    required = []
    for item in dataclasses.fields(cls):
        spec = item.metadata.get(SCHEMA_KEY)
        spec = spec() if callable(spec) else spec
        nested = _settings_class(cls, item)
        if spec is None and nested is not None:
            spec = dict(class_schema(nested))
            if item.default is None:
                spec["type"] = ["object", "null"]
        elif spec is None:
            spec = known.get(item.name, {})
        properties[item.name] = spec
        missing = dataclasses.MISSING
        has_default = item.default is not missing or item.default_factory is not missing
        if not has_default and "default" not in spec:
            required.append(item.name)
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "required": required,
    }


def clear_caches() -> None:
    """Forget what was derived from the schema (after a family's section is added)."""
    class_schema.cache_clear()


def _section_of(cls: type, path: tuple[str, ...] | None) -> tuple[str, ...]:
    return tuple(getattr(cls, "SECTION", ())) if path is None else tuple(path)


def _kinds(owner: type, item: dataclasses.Field) -> tuple[Any, ...]:
    """The types a field's annotation allows (``int | None``: int and NoneType)."""
    hint = _hints(owner).get(item.name)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return () if hint is None else (hint,)


@cache
def _hints(owner: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(owner)
    except (NameError, TypeError):  # an annotation that names what the module imports late
        return {}


def _settings_class(owner: type, item: dataclasses.Field) -> type | None:
    """The settings dataclass a field holds (``X`` or ``X | None``), if it holds one."""
    if SCHEMA_KEY in item.metadata:
        return None
    kinds = [kind for kind in _kinds(owner, item) if kind is not type(None)]
    if len(kinds) == 1 and isinstance(kinds[0], type) and dataclasses.is_dataclass(kinds[0]):
        return kinds[0]
    return None


def _build(cls: type[T], data: dict[str, Any], where: str, error: type[ValueError]) -> T:
    """``cls`` from checked ``data``, then its ``RULES``."""
    values = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name not in data:
            continue
        value = data[item.name]
        kinds = {typing.get_origin(kind) or kind for kind in _kinds(cls, item)}
        nested = _settings_class(cls, item)
        if value is not None and BUILD_KEY in item.metadata:
            value = item.metadata[BUILD_KEY](value)
        elif isinstance(value, dict) and nested is not None:
            value = _build(nested, value, f"{where}.{item.name}", error)
        elif isinstance(value, int) and not isinstance(value, bool) and float in kinds:
            value = float(value)
        elif isinstance(value, list) and tuple in kinds:
            value = tuple(value)
        values[item.name] = value
    settings = cls(**values)
    problems = [text for rule in getattr(cls, "RULES", ()) if (text := rule(settings, where))]
    if problems:
        raise error("; ".join(problems))
    return settings
