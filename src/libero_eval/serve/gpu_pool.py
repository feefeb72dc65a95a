"""A serve job takes free GPUs from a pool, so that two servers started at once never share one.

Locally Snakemake counts GPUs (`--resources gpu=N`) but assigns no device ids (NOTES §4), and
the slot index no longer names a GPU when checkpoints' servers start as earlier ones finish
(10 checkpoints on 8 GPUs: the 9th takes whichever GPU the first to finish gave back). So a
serve job given ``--gpu-pool 0,1,...`` takes, for as long as it runs, an exclusive lock
(``fcntl.flock``) on one lock file per GPU it uses, ``<lock dir>/gpu<K>.lock``, trying the
pool in order. The kernel drops a lock when its process exits, however it exits (kill -9
included), so a dead serve job never holds a GPU. When every GPU of the pool is held (more
servers than GPUs, i.e. `--resources gpu` above the pool), the job waits, saying so.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

WAIT_POLL_S = 1.0


@dataclass
class HeldGpus:
    """The GPUs a serve job holds; the locks go with the process (or :meth:`release`)."""

    ids: list[int]
    handles: list[IO[bytes]] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for handle in self.handles:
            handle.close()
        self.handles.clear()

    @property
    def pin(self) -> int | list[int]:
        """`ServerSettings.gpu_id` for these GPUs (an int for one)."""
        return self.ids[0] if len(self.ids) == 1 else list(self.ids)


def parse_pool(text: str) -> list[int]:
    """``"0,1,3"`` as ``[0, 1, 3]``; ValueError names the flag."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--gpu-pool: {text!r} is not a comma-separated list of GPU ids") from None
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise ValueError(f"--gpu-pool: {text!r}: list each GPU id (>= 0) once")
    return ids


def try_take(pool: Sequence[int], count: int, lock_dir: Path) -> HeldGpus | None:
    """The first `count` GPUs of `pool` whose locks are free, locked; None (nothing kept)
    when fewer are free."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    held = HeldGpus([])
    for gpu in pool:
        handle = open(lock_dir / f"gpu{gpu}.lock", "ab")  # noqa: SIM115 - held while serving
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        os.set_inheritable(handle.fileno(), False)  # the server's processes do not hold it
        held.ids.append(gpu)
        held.handles.append(handle)
        if len(held.ids) == count:
            return held
    held.release()
    return None


def take_gpus(
    pool: Sequence[int],
    count: int,
    lock_dir: Path,
    stopped: Callable[[float], bool],
    say: Callable[[str], None],
) -> HeldGpus | None:
    """Wait until `count` GPUs of `pool` are free and take them; None when `stopped(timeout)`
    (which sleeps up to `timeout` seconds) says the job was asked to stop while waiting."""
    if count > len(pool):
        raise ValueError(
            f"--gpu-pool: a server needs {count} GPUs but the pool has {len(pool)} ({pool})"
        )
    said = False
    while True:
        held = try_take(pool, count, lock_dir)
        if held is not None:
            return held
        if not said:
            say(
                f"waiting for {count} free GPU(s) of {list(pool)}: all are held by other "
                f"servers (locks in {lock_dir}); run with --resources gpu={len(pool)} so that "
                "Snakemake starts no more servers than there are GPUs"
            )
            said = True
        if stopped(WAIT_POLL_S):
            return None
