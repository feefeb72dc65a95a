"""A checkpoint's identity: its files' content hash, its training step, what changed on disk.

A checkpoint directory is identified by the SHA-256 of every regular file under it (links
followed, so a Hugging Face snapshot of symlinks hashes the blobs it points to), each as
``<relative path> <size> <sha256>``, sorted, then hashed once more: ``Checkpoint.sha256``.
Renaming or moving the directory keeps the content hash; changing any byte of any file changes
it. Hidden entries (a name starting with ``.``, e.g. ``.cache/`` or ``.gitattributes``) and
files that end in ``.lock`` or ``.tmp`` are left out: they are not the model, and a trainer or a
download may still be writing them.

Hashing 28 GB of weights takes minutes, so each file's hash is cached (:class:`HashCache`, a
JSON file) under its resolved path, size and modification time in nanoseconds: a rerun reads no
file whose three are unchanged, and a file rewritten in place (new mtime or size) is read
again. ``hashlib.file_digest`` reads in large blocks without holding the file in memory.

The training step comes from the checkpoint where its trainer wrote one (:func:`read_step`):
Hugging Face Trainer's ``trainer_state.json`` (``global_step``; transformers
``trainer_callback.py``, ``TrainerState.save_to_json``, written into ``checkpoint-<step>/`` by
``Trainer._save_checkpoint``), LeRobot's ``../training_state/training_step.json`` (``step``;
lerobot ``utils/train_utils.py``, ``save_training_step``, beside the
``checkpoints/<step>/pretrained_model/`` an SGLang server loads), the reference server's
``reference_checkpoint.yaml`` (``step``); else from its name (:func:`step_from_name`:
``checkpoint-1000``, ``step_1000``, ``global_step1000``, ``ckpt-1000``, ``iter_1000``, or a
name of digits such as LeRobot's and openpi's ``005000``/``5000``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

# The reference server's checkpoint format (docs/training_runs.md): a directory holding this
# file, whose keys are server.reference fields (and `step`); files it names are relative to it.
REFERENCE_CHECKPOINT_FILE = "reference_checkpoint.yaml"
SKIPPED_SUFFIXES = (".lock", ".tmp")
# Where the step lives in a trainer's checkpoint: (path relative to the checkpoint directory,
# key) in order; the first readable integer wins.
STEP_FILES: tuple[tuple[str, str, str], ...] = (
    ("trainer_state.json", "global_step", "Hugging Face Trainer"),
    ("../training_state/training_step.json", "step", "LeRobot"),
    (REFERENCE_CHECKPOINT_FILE, "step", "reference checkpoint"),
)
STEP_NAME = re.compile(
    r"(?:^|[_-])(?:checkpoint|ckpt|step|global_step|iter|iteration)[_-]?(\d+)$|^(\d+)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint, size and SHA-256."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run (``checkpoints:``), resolved: its name (the output folder
    ``results/<run>/checkpoints/<name>/``), its directory (None for a server named by URL), its
    training step and where the step came from, the entry of ``checkpoints:`` it came from, its
    content hash and files. It crosses to the jobs as :meth:`to_dict`; to a rollout job
    without its entry (:meth:`for_jobs`), whose place in the list changes no episode."""

    name: str
    path: str | None
    step: int | None
    step_source: str
    entry: int | None = None  # None where it crossed to a job without it
    sha256: str | None = None
    files: tuple[FileEntry, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return data

    def for_jobs(self) -> dict[str, Any]:
        """:meth:`to_dict` without the entry: a checkpoint listed before this one later (a
        lower step) moves its entry, not its episodes, and must not rerun its jobs (Snakemake
        reruns a job whose params change)."""
        data = self.to_dict()
        del data["entry"]
        return data

    @property
    def where(self) -> str:
        """How an error names it: its entry of ``checkpoints:``, else its name."""
        return f"checkpoints[{self.entry}]" if self.entry is not None else f"checkpoint {self.name}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Checkpoint:
        values = dict(data)
        values["files"] = tuple(FileEntry(**f) for f in values.get("files") or ())
        return cls(**values)

    def identity(self) -> dict[str, Any]:
        """Its part of the rollout fingerprint: the content hash (the path is the server's)."""
        return {"sha256": self.sha256} if self.path is not None else {"name": self.name}


def _is_skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith(SKIPPED_SUFFIXES)


def checkpoint_files(directory: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file that makes up the checkpoint, sorted; symlinks to
    files and directories are followed (a directory reached twice is read once)."""
    seen: set[tuple[int, int]] = set()
    found: list[tuple[str, Path]] = []
    for root, dirs, names in os.walk(directory, followlinks=True):
        stat = os.stat(root)
        if (stat.st_dev, stat.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((stat.st_dev, stat.st_ino))
        dirs[:] = sorted(d for d in dirs if not _is_skipped(d))
        for name in names:
            path = Path(root) / name
            if not _is_skipped(name) and path.is_file():
                found.append((path.relative_to(directory).as_posix(), path))
    yield from sorted(found)


class HashCache:
    """SHA-256 of files by (resolved path, size, mtime_ns), kept in a JSON file so that a rerun
    does not read unchanged weights again. Concurrent writers lose at most an entry (then read
    once more): each write merges what is on disk and replaces the file atomically."""

    def __init__(self, path: Path | str | None):
        self.path = Path(path) if path is not None else None
        self._entries: dict[str, dict[str, Any]] = self._load()
        self._dirty = False
        self.files_read = 0  # files this object hashed (not found in the cache)

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def sha256(self, path: Path) -> str:
        real = os.path.realpath(path)
        stat = os.stat(real)
        known = self._entries.get(real) or {}
        if (known.get("size"), known.get("mtime_ns")) == (stat.st_size, stat.st_mtime_ns):
            return str(known["sha256"])
        with open(real, "rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        self.files_read += 1
        self._entries[real] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
        self._dirty = True
        return digest

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        merged = {**self._load(), **self._entries}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(fd, "w") as handle:
            json.dump(merged, handle, sort_keys=True)
        os.replace(tmp, self.path)
        self._dirty = False


def hash_directory(directory: Path, cache: HashCache) -> tuple[str, tuple[FileEntry, ...]]:
    """(content hash, files) of a checkpoint directory (module docstring)."""
    files = tuple(
        FileEntry(relative, path.stat().st_size, cache.sha256(path))
        for relative, path in checkpoint_files(directory)
    )
    lines = "".join(f"{f.path} {f.size} {f.sha256}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest(), files


def changed_files(old: tuple[FileEntry, ...], new: tuple[FileEntry, ...]) -> list[str]:
    """What differs between two file lists of one checkpoint, one phrase per file:
    ``transformer/a.safetensors changed (sha256 1f2e.. -> 9a0b..)``, ``x added``, ``y removed``."""
    before, after = {f.path: f for f in old}, {f.path: f for f in new}
    phrases = []
    for path in sorted(before.keys() | after.keys()):
        a, b = before.get(path), after.get(path)
        if a is None:
            phrases.append(f"{path} added")
        elif b is None:
            phrases.append(f"{path} removed")
        elif a.sha256 != b.sha256:
            phrases.append(f"{path} changed (sha256 {a.sha256[:8]}.. -> {b.sha256[:8]}..)")
    return phrases


def step_from_name(name: str) -> int | None:
    """The step a checkpoint's directory name states (module docstring), or None."""
    match = STEP_NAME.search(name)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def read_step(directory: Path) -> tuple[int, str] | None:
    """(step, where it was read) from the trainer's own files (:data:`STEP_FILES`), else from
    the directory's name or, for LeRobot's ``<step>/pretrained_model``, its parent's; None
    when neither says."""
    for relative, key, trainer in STEP_FILES:
        path = directory / relative
        try:
            text = path.read_text()
        except OSError:
            continue
        try:
            data = yaml.safe_load(text)  # JSON is YAML
        except yaml.YAMLError:
            continue
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value, f"{os.path.normpath(relative)} {key} ({trainer})"
    for name in (directory.name, directory.parent.name):
        step = step_from_name(name)
        if step is not None:
            return step, f"name {name!r}"
    return None
