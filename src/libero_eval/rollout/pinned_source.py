"""The installed source of robosuite / LIBERO functions that the rollout copies or relies on,
as sha256 digests, so that a test fails when an upgrade changes one of them
(`libero_eval.rollout.fast_reset`, `libero_eval.rollout.single_forward`)."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Mapping
from typing import Any


def resolve(qualified: str) -> Any:
    """The object a dotted name (``package.module.Class.method``) names."""
    parts = qualified.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(qualified)


def source_hashes(pins: Mapping[str, str]) -> dict[str, str]:
    """sha256 of the installed source of each function that `pins` names."""
    return {
        name: hashlib.sha256(inspect.getsource(resolve(name)).encode()).hexdigest() for name in pins
    }


def changed_sources(pins: Mapping[str, str]) -> list[str]:
    """The names in `pins` whose installed source no longer has the pinned digest."""
    return [name for name, digest in source_hashes(pins).items() if pins[name] != digest]
