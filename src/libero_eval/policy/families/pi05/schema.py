"""π0.5's parts of the config schema (``schema.yaml`` beside this file, package data):
``policy.pi05`` and the fields it adds to ``server.reference``, merged into the config
schema on import, so that the family's modules read their fields, defaults and choices through
:mod:`libero_eval.settings_schema` before the registry registers the family."""

from __future__ import annotations

from libero_eval.policy.families import load_schema

NAME = "pi05"
POLICY, REFERENCE = load_schema(__package__, NAME)
PATH = ("policy", NAME)  # the section's path in the config
