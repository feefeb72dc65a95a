"""`libero-eval watch DIR`: evaluate a training run's checkpoints as they appear.

Every ``poll_s`` seconds the watcher lists the directories in DIR that match ``pattern``
(``checkpoint-*`` by default; a glob never lists hidden names, so a trainer's temporary
``.tmp*`` directory is not seen). A checkpoint is complete when its marker file exists (with
``--marker``, e.g. ``trainer_state.json``, which Hugging Face's Trainer writes last) and none
of its files (`checkpoint_identity.checkpoint_files`) changed in the last ``stable_s``
seconds: their newest status change (ctime, which a write, a rename or a copy that keeps the
source's mtime all set) is that old. When the set of complete checkpoints grows, or one of them
changes, the watcher runs the workflow once, with every complete checkpoint listed by path
(`checkpoints:` in a config overlay it writes to ``.snakemake/libero_eval/watch/``), and
waits for it to end before it looks again: one evaluation at a time, at most one per poll. The
workflow runs only what is new (each checkpoint's episodes are cached under its fingerprint)
and rewrites the learning curve. The watcher only reads the training run's files (listing,
stat, and the workflow's hashing); it writes nothing under DIR. A failed evaluation is
reported and tried again when something changes.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from libero_eval.checkpoint_identity import checkpoint_files

OVERLAY = Path(".snakemake/libero_eval/watch/checkpoints.yaml")

Snapshot = tuple[tuple[str, int, int], ...]


def snapshot(directory: Path) -> tuple[Snapshot, float]:
    """(the checkpoint's files as (relative path, size, mtime_ns), the newest of their ctimes
    in seconds); empty and 0 while it has none."""
    entries, newest = [], 0.0
    for relative, path in checkpoint_files(directory):
        try:
            stat = path.stat()
        except FileNotFoundError:  # removed while listed: the next poll sees the change
            continue
        entries.append((relative, stat.st_size, stat.st_mtime_ns))
        newest = max(newest, stat.st_ctime, stat.st_mtime)
    return tuple(entries), newest


@dataclass
class Watcher:
    """The watch loop's state (module docstring); `run` runs the workflow on a list of
    checkpoint paths and returns its exit code; `clock` gives the time in seconds since the
    epoch, as file times count it (both injectable)."""

    directory: Path
    run: Callable[[list[str]], int]
    pattern: str = "checkpoint-*"
    stable_s: float = 120.0
    marker: str | None = None
    clock: Callable[[], float] = time.time
    say: Callable[[str], None] = print
    evaluated: dict[str, Snapshot] | None = None  # what the last evaluation ran, by path

    def candidates(self) -> list[str]:
        found = glob.glob(os.path.join(glob.escape(str(self.directory)), self.pattern))
        return sorted(p for p in found if os.path.isdir(p))

    def complete(self) -> dict[str, Snapshot]:
        """Every candidate that is complete now (module docstring), with its files."""
        now, ready = self.clock(), {}
        for path in self.candidates():
            if self.marker and not (Path(path) / self.marker).exists():
                continue
            files, newest = snapshot(Path(path))
            if files and now - newest >= self.stable_s:
                ready[path] = files
        return ready

    def poll(self) -> int | None:
        """One look: run the workflow when the complete checkpoints differ from those it last
        ran; its exit code, or None when there was nothing new."""
        ready = self.complete()
        if not ready or ready == self.evaluated:
            return None
        before = self.evaluated or {}
        news = [f"{Path(p).name} (new)" for p in sorted(set(ready) - set(before))]
        news += [
            f"{Path(p).name} (changed)"
            for p in sorted(ready)
            if before.get(p, ready[p]) != ready[p]
        ]
        self.say(f"[watch] evaluating {len(ready)} checkpoints: {', '.join(news) or 'fewer'}")
        code = self.run(sorted(ready))
        self.evaluated = ready  # a failure is retried once something changes
        if code != 0:
            self.say(f"[watch] the workflow failed (exit code {code}); it runs again on a change")
        return code


def snakemake_runner(
    configfiles: Sequence[str], cores: str, extra: Sequence[str] = ()
) -> Callable[[list[str]], int]:
    """A `Watcher.run` that runs this environment's Snakemake in the working directory with
    `configfiles` and an overlay listing the checkpoints."""

    def run(paths: list[str]) -> int:
        OVERLAY.parent.mkdir(parents=True, exist_ok=True)
        OVERLAY.write_text(
            "# written by `libero-eval watch`: the complete checkpoints it found\n"
            + yaml.safe_dump({"checkpoints": [os.path.abspath(p) for p in paths]})
        )
        command = [sys.executable, "-m", "snakemake", "--cores", cores, "--configfile"]
        command += [*configfiles, str(OVERLAY), *extra]
        return subprocess.call(command)

    return run


def watch(
    watcher: Watcher,
    poll_s: float,
    once: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Poll every `poll_s` seconds until interrupted; with `once`, poll once (a cron job).
    Returns the last evaluation's exit code (0 without one)."""
    last = 0
    while True:
        code = watcher.poll()
        last = last if code is None else code
        if once:
            return last
        sleep(poll_s)
