"""``policy.cosmos3`` as its schema writes it (``schema.yaml`` beside this file, package data,
with the fields Cosmos3 adds to ``server.reference``): loaded and merged into the config schema
when the package is imported, so that its modules take their fields, choices and defaults from
the one schema before the registry registers the family."""

from __future__ import annotations

from typing import Any

from libero_eval import settings_schema
from libero_eval.policy.families import load_schema

POLICY, REFERENCE = load_schema(__package__, "cosmos3")
PATH = ("policy", "cosmos3")
# Every `policy.cosmos3.*` field, in the schema's order.
FIELDS: tuple[str, ...] = settings_schema.fields(*PATH)
# The fields restricted to a list of values (the action math's own lists must agree,
# tests/test_settings_defined_once.py); the defaults, for callers that give no value.
CHOICES: dict[str, tuple[Any, ...]] = settings_schema.choices(*PATH)
DEFAULTS: dict[str, Any] = settings_schema.defaults(*PATH)
