"""A training run's checkpoints (`checkpoints:`), resolved from the config, and each one's config.

Each entry of `checkpoints:` is a directory, a glob of directories, or ``{path, name, step}``
(the schema's description). :func:`resolve_checkpoints` expands the globs (directories only,
in natural order: ``checkpoint-500`` before ``checkpoint-1000``), names each checkpoint (the
entry's name, else the directory's, or the parts of its path a glob matched), reads its step
(`checkpoint_identity.read_step`; the entry's step first) and hashes its files
(`checkpoint_identity.hash_directory`, with the run's hash cache). A path reached twice (a
symlink such as LeRobot's ``checkpoints/last``) counts once. The checkpoints come back sorted by
step when every one has a step, else in the order listed. Bad input is a `ConfigError` naming
the entry (``checkpoints[2]``) and the fix: a glob that matches nothing, a missing directory, a
name given for a glob of several, two checkpoints of one name.

:func:`checkpoint_config` is the config a checkpoint's jobs run with: the run's, with its
`server` section from `config_server.checkpoint_server` (the checkpoint where the backend
names its model) and no `checkpoints:`; whether the directory is a checkpoint of the run's
family is then the family's own check of that config (`config.check_config`).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
from pathlib import Path
from typing import Any

from libero_eval.checkpoint_identity import (
    Checkpoint,
    FileEntry,
    HashCache,
    changed_files,
    hash_directory,
    read_step,
)
from libero_eval.config_layout import ConfigError
from libero_eval.config_server import PATHLESS_BACKENDS, checkpoint_server

FIELD = "checkpoints"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# A directory name that says nothing of the checkpoint: its parent names it instead (LeRobot
# saves `checkpoints/<step>/pretrained_model/`, lerobot utils/constants.py PRETRAINED_MODEL_DIR).
GENERIC_NAMES = ("pretrained_model",)
# Where a checkpoint's aggregate step records what it ran with (read back to say what changed).
RECORD = Path("summary") / "checkpoint.json"


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).lstrip("_.-")
    return name or "checkpoint"


def _name_of(pattern: str, match: str) -> str:
    """The parts of `match` that `pattern`'s wildcards matched, joined by '-'; the directory's
    own name (or its parent's, for a generic one) when the pattern has none."""
    pattern_parts, match_parts = Path(pattern).parts, Path(match).parts
    matched = []
    if glob.has_magic(pattern) and len(pattern_parts) == len(match_parts):
        matched = [m for p, m in zip(pattern_parts, match_parts, strict=True) if glob.has_magic(p)]
    if not matched:
        path = Path(os.path.normpath(match))
        matched = [path.parent.name if path.name in GENERIC_NAMES else path.name]
    return _safe_name("-".join(matched))


def checkpoint_entries(config: dict[str, Any]) -> list[dict[str, Any]]:
    """`checkpoints:` as mappings ``{path, name, step}`` (a string is ``{path: it}``); empty for
    a single run."""
    entries = config.get(FIELD) or []
    return [{"path": e} if isinstance(e, str) else dict(e) for e in entries]


def _matches(field: str, pattern: str) -> list[str]:
    expanded = os.path.expanduser(pattern)
    if glob.has_magic(expanded):
        found = [p for p in glob.glob(expanded, recursive=True) if os.path.isdir(p)]
        if not found:
            raise ConfigError(
                f"{field}: {pattern!r} matches no directory (relative paths start at "
                f"{Path.cwd()}); check the pattern, or remove the entry until its training "
                "run has saved a checkpoint"
            )
        return sorted(found, key=_natural)
    if not os.path.isdir(expanded):
        raise ConfigError(
            f"{field}: {pattern!r} is not a directory (relative paths start at {Path.cwd()}); "
            "give a checkpoint directory or a glob of them"
        )
    return [expanded]


def list_checkpoints(config: dict[str, Any]) -> tuple[list[Checkpoint], list[str]]:
    """(the checkpoints, unhashed, in their final order; notes for the log) from `checkpoints:`
    (module docstring)."""
    backend = config["server"]["backend"]
    found: list[Checkpoint] = []
    notes: list[str] = []
    seen: dict[str, str] = {}
    for index, entry in enumerate(checkpoint_entries(config)):
        field = f"{FIELD}[{index}]"
        pattern = entry.get("path")
        if pattern is None:
            if backend not in PATHLESS_BACKENDS or "name" not in entry:
                raise ConfigError(
                    f"{field}: give the checkpoint's path (a directory or a glob); only "
                    f"server.backend {' or '.join(PATHLESS_BACKENDS)} takes a checkpoint by "
                    "name alone"
                )
            found.append(Checkpoint(entry["name"], None, entry.get("step"), "entry", index))
            continue
        matches = _matches(field, pattern)
        if len(matches) > 1 and ("name" in entry or "step" in entry):
            given = ", ".join(key for key in ("name", "step") if key in entry)
            raise ConfigError(
                f"{field}: {pattern!r} matches {len(matches)} directories, but {given} "
                "describes one checkpoint; list them one by one, or drop " + given
            )
        for match in matches:
            real = os.path.realpath(match)
            if real in seen:
                notes.append(f"{field}: {match} is {seen[real]} (the same directory), counted once")
                continue
            seen[real] = match
            if "step" in entry:
                step, source = entry["step"], f"{field}.step"
            else:
                step, source = read_step(Path(match)) or (None, "order")
            name = entry.get("name") or _name_of(pattern, match)
            found.append(Checkpoint(name, os.path.abspath(match), step, source, index))
    _refuse_duplicate_names(found)
    if found and all(c.step is not None for c in found):
        found.sort(key=lambda c: (c.step, _natural(c.name)))
    elif any(c.step is not None for c in found):
        unknown = ", ".join(c.name for c in found if c.step is None)
        notes.append(
            f"{FIELD}: no training step for {unknown} (set step: in its entry); the learning "
            "curve places every checkpoint in the order listed"
        )
    return found, notes


def _refuse_duplicate_names(found: list[Checkpoint]) -> None:
    by_name: dict[str, Checkpoint] = {}
    for checkpoint in found:
        other = by_name.setdefault(checkpoint.name, checkpoint)
        if other is not checkpoint:
            raise ConfigError(
                f"{FIELD}[{other.entry}] and {FIELD}[{checkpoint.entry}] both name a checkpoint "
                f"{checkpoint.name!r} ({other.path} and {checkpoint.path}); a name is its "
                "output folder: give one of them another name ({path: ..., name: ...})"
            )


def hashed(checkpoint: Checkpoint, cache: HashCache) -> Checkpoint:
    """`checkpoint` with its content hash and files (`checkpoint_identity.hash_directory`)."""
    if checkpoint.path is None:
        return checkpoint
    sha256, files = hash_directory(Path(checkpoint.path), cache)
    if not files:
        raise ConfigError(
            f"{FIELD}[{checkpoint.entry}]: {checkpoint.path} holds no files; is the training "
            "run still writing it?"
        )
    return Checkpoint(**{**checkpoint.__dict__, "sha256": sha256, "files": files})


def checkpoint_config(config: dict[str, Any], checkpoint: Checkpoint) -> dict[str, Any]:
    """The config `checkpoint`'s jobs run with (module docstring); a `ConfigError` naming the
    entry when the checkpoint does not fit the backend."""
    try:
        server = checkpoint_server(config, checkpoint)
    except ValueError as exc:
        raise ConfigError(f"{checkpoint.where} ({checkpoint.path}): {exc}") from None
    rest = copy.deepcopy({key: value for key, value in config.items() if key != "server"})
    return {**rest, "server": server, FIELD: None}


def checkpoint_record(checkpoint: Checkpoint, fingerprint: str) -> dict[str, Any]:
    """What a checkpoint's aggregate step writes to ``summary/checkpoint.json``."""
    return {**checkpoint.to_dict(), "fingerprint": fingerprint}


def what_changed(run_dir: Path, checkpoint: Checkpoint, fingerprint: str) -> str | None:
    """Why `checkpoint`'s episodes run again although it ran before: its files changed since
    the record its last aggregate wrote (``results/<run>/checkpoints/<name>/summary/
    checkpoint.json``), each changed file named; None when nothing changed or it never ran."""
    try:
        before = json.loads((run_dir / "checkpoints" / checkpoint.name / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(before, dict) or before.get("fingerprint") in (None, fingerprint):
        return None
    old_files = tuple(FileEntry(**f) for f in before.get("files") or ())
    changes = changed_files(old_files, checkpoint.files)
    if before.get("path") != checkpoint.path:
        changes.insert(0, f"its path changed ({before.get('path')} -> {checkpoint.path})")
    if not changes:  # the run's episode-defining settings changed, not the checkpoint
        return None
    return (
        f"checkpoint {checkpoint.name} changed on disk since its episodes ran: "
        f"{'; '.join(changes)}. Its episodes run again under fingerprint "
        f"{fingerprint}; those of {before['fingerprint']} stay in "
        f"{run_dir / 'checkpoints' / checkpoint.name / 'episodes' / before['fingerprint']}"
    )
