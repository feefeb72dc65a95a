"""The config schema (``libero_eval/data/schema.yaml``, package data), read once: the one
place a config field's name, type and default are written. Code that needs a default (an
adapter built without a validated config, the report given a partial config) takes it from here
rather than writing it again."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from libero_eval import package_data

# src/libero_eval/data/schema.yaml in the repository (Snakemake's `validate` reads it there)
SCHEMA_PATH: Path = package_data.path("schema.yaml")


@cache
def schema() -> dict[str, Any]:
    """The JSON schema of a run config (the workflow validates with it and fills defaults)."""
    return yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))


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
