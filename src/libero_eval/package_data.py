"""The files the package carries and reads by default (``libero_eval/data/``): the config
schema and the statistics files the schema names as defaults. They are package data, read
with :mod:`importlib.resources`, so an installed wheel finds them wherever it runs.

A config names a shipped file as ``libero_eval:<name>``, e.g.
``libero_eval:stats/libero_native_frame_wise_relative_rot6d.json`` (the schema's defaults do);
any other value is a file path, relative to the working directory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PREFIX = "libero_eval:"


def path(name: str) -> Path:
    """The file ``name`` under ``libero_eval/data/`` (the package is installed as files, never
    zipped: setuptools' wheels unpack into site-packages)."""
    return Path(str(resources.files("libero_eval").joinpath("data", *name.split("/"))))


def resolve(value: str | Path) -> Path:
    """A config's file path: ``libero_eval:<name>`` is the shipped file, anything else a path."""
    text = str(value)
    return path(text.removeprefix(PREFIX)) if text.startswith(PREFIX) else Path(value)
