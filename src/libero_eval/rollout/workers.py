"""A shard's env workers as one set: started together, each closed as soon as it has no
episode left, the rest closed together at the end.

A worker's close sends CLOSE and waits for its process to close its env and exit, a few
seconds with a renderer. Closing one after another made a shard's end take 15-25 s on one
H200 (issue 39); here every worker is asked at once and the joins share one deadline, so the
set closes in about the time of its slowest worker. A worker with no episode left is asked to
close at once (`retire`): its process exits while the others still run, and frees its core.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from libero_eval.rollout.env_worker import EnvWorker

CLOSE_TIMEOUT_S = 10.0  # a worker not gone by then is killed (its env's close hung)


class WorkerSet:
    """The shard's env workers by index; `active` are those not yet closed."""

    def __init__(self, make: Callable[[int], EnvWorker], count: int):
        """Start `count` workers (`make(i)` starts worker i). If one cannot be started, the
        ones already started are killed and the error is raised."""
        self._workers: list[EnvWorker] = []
        try:
            for index in range(count):
                self._workers.append(make(index))
        except BaseException:
            close_together(self._workers, kill=True)
            raise
        self._retired: set[int] = set()

    def __len__(self) -> int:
        return len(self._workers)

    def __getitem__(self, index: int) -> EnvWorker:
        return self._workers[index]

    def __iter__(self) -> Iterator[EnvWorker]:
        return iter(self._workers)

    @property
    def active(self) -> list[EnvWorker]:
        """The workers not retired."""
        return [w for w in self._workers if w.index not in self._retired]

    def by_conn(self, conn: object) -> EnvWorker:
        return next(w for w in self._workers if w.conn is conn)

    def retire(self, index: int) -> None:
        """Worker `index` has no episode left: ask it to close now (its process exits while
        the others run; `close` joins it)."""
        if index not in self._retired:
            self._retired.add(index)
            self._workers[index].request_close()

    def close(self, kill: bool = False, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close every worker together; `kill`: at once, without letting envs close (a
        failing or terminated shard loses its episodes in flight anyway)."""
        close_together(self._workers, kill=kill, timeout_s=timeout_s)


def close_together(
    workers: list[EnvWorker], kill: bool = False, timeout_s: float = CLOSE_TIMEOUT_S
) -> None:
    """Ask every worker to close (or kill each), then join them all within one deadline."""
    for worker in workers:
        if kill:
            if worker.process is not None and worker.process.is_alive():
                worker.process.kill()
        else:
            worker.request_close()
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        worker.join(deadline - time.monotonic())
