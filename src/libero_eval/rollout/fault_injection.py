"""Fault injection as wrappers, built where the rollout job is composed (`shard_job`).

A fault plan (`libero_eval.faults.Faults`, from ``LIBERO_EVAL_FAULT``) is carried out by
wrapping what the shard runner is given, never by a hook in its loop:

- :class:`FaultyEnv` wraps an env worker (`env_worker.EnvWorker`, in the shard process): the
  shard's N-th episode start fails as the plan says (its env process is SIGKILLed after the
  reset: ``crash``; the start answers an error: ``raise``), or the episode's first action
  chunk reaches the env as NaN. The workers of a shard share one count of episodes started
  (:class:`EpisodeCount`); a retried episode is not counted again and runs clean.
- :class:`FaultyConnection` wraps a policy connection (`policy.connection.PolicyConnection`):
  the shard's N-th request is rejected (``reject_request_at``), as a server answering 4xx
  does; the connections of a shard's policy threads share one count (:class:`RequestCount`).
- :class:`FaultyStore` wraps the episode store: after each durable record it lets the plan
  kill or fail the shard (``exit_shard_after_episodes``, ``fail_shard_once``); after N, the
  disk is full for it (``disk_full_after_episodes``: the store's own write, its temporary file
  on /dev/full).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from libero_eval import store as store_module
from libero_eval.failures import FailurePolicy
from libero_eval.faults import Faults
from libero_eval.plan import Episode
from libero_eval.policy.connection import ConnectionSpec, PolicyConnection, connect
from libero_eval.policy.connection_base import ClosedOnExit
from libero_eval.policy.errors import PolicyRequestRejected
from libero_eval.rollout.env_worker import Command, EnvWorker, Reply, Status
from libero_eval.rollout.libero_env import EpisodeSpec
from libero_eval.store import EpisodeStore

INJECTED_ENV_ERROR = "RuntimeError: injected env error (LIBERO_EVAL_FAULT)"


class EpisodeCount:
    """The episodes a shard's workers have started, retries not counted (1-based)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int, int, int | None]] = set()

    def first_start(self, spec: EpisodeSpec) -> int | None:
        """The number of ``spec``'s episode among the shard's starts, or None for a retry."""
        key = (spec.suite, spec.task_id, spec.init_state_id, spec.seed)
        if key in self._seen:
            return None
        self._seen.add(key)
        return len(self._seen)


class FaultyEnv:
    """An env worker that fails the episode starts and chunks the plan names (see the module
    docstring); everything else is the wrapped worker's."""

    def __init__(self, worker: EnvWorker, faults: Faults, count: EpisodeCount):
        self._worker = worker
        self._faults = faults
        self._count = count
        self._start_fault: str | None = None  # "crash" or "raise": the start in flight fails
        self._nan_next_chunk = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)

    def send(self, command: Command, payload: Any) -> None:
        if command == Command.START:
            number = self._count.first_start(payload)
            faults = self._faults
            self._start_fault = None
            if number is not None and number == faults.crash_env_at_episode:
                self._start_fault = "crash"
            elif number is not None and number == faults.raise_env_at_episode:
                self._start_fault = "raise"
            elif number is not None and number == faults.nan_action_at_episode:
                self._nan_next_chunk = True
        elif command == Command.CHUNK and self._nan_next_chunk:
            self._nan_next_chunk = False
            payload = np.full_like(np.asarray(payload, dtype=float), np.nan)
        self._worker.send(command, payload)

    def receive(self) -> Reply:
        reply = self._worker.receive()
        fault, self._start_fault = self._start_fault, None
        if fault is None or reply.status != Status.OK:
            return reply
        if fault == "raise":
            return Reply(Status.ERROR, INJECTED_ENV_ERROR)
        process = self._worker.process  # "crash": the env process dies after its reset
        process.kill()
        process.join(timeout=5)
        return Reply(Status.DIED, f"env worker process died (exit code {process.exitcode})")


def faulty_env_workers(
    make_worker: Callable[[int], EnvWorker], faults: Faults
) -> Callable[[int], FaultyEnv]:
    """A factory of a shard's env workers, each wrapped in a :class:`FaultyEnv` sharing one
    :class:`EpisodeCount`."""
    count = EpisodeCount()
    return lambda index: FaultyEnv(make_worker(index), faults, count)


class RequestCount:
    """The policy requests a shard has sent, over all its policy threads (1-based)."""

    def __init__(self) -> None:
        self._sent = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._sent += 1
            return self._sent


class FaultyConnection(ClosedOnExit):
    """A policy connection whose shard's ``reject_request_at``-th request is rejected (before
    it is sent); everything else is the wrapped connection's."""

    def __init__(self, connection: PolicyConnection, faults: Faults, count: RequestCount):
        self._connection = connection
        self._faults = faults
        self._count = count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def infer(self, payload: dict[str, Any]) -> dict[str, Any]:
        number = self._count.next()
        if number == self._faults.reject_request_at:
            raise PolicyRequestRejected(
                f"injected rejected request {number} (LIBERO_EVAL_FAULT reject_request_at)",
                status=None,
                detail=None,
            )
        return self._connection.infer(payload)

    def close(self) -> None:
        self._connection.close()


def faulty_connections(
    faults: Faults,
) -> Callable[[ConnectionSpec, FailurePolicy], FaultyConnection]:
    """A factory of a shard's policy connections (`policy.connection.connect`), each wrapped
    in a :class:`FaultyConnection` sharing one :class:`RequestCount`."""
    count = RequestCount()
    return lambda spec, failures: FaultyConnection(connect(spec, failures), faults, count)


class FaultyStore:
    """An episode store that lets the plan kill or fail the shard after a durable record."""

    def __init__(self, store: EpisodeStore, faults: Faults, shard: str):
        self._store = store
        self._faults = faults
        self._shard = shard
        self.persisted = 0  # records this process wrote

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write(self, episode: Episode, record: dict[str, Any]) -> Any:
        full_after = self._faults.disk_full_after_episodes
        if full_after is not None and self.persisted >= full_after:
            with _temporary_files_on_dev_full():
                return self._store.write(episode, record)  # raises the store's DiskFullError
        written = self._store.write(episode, record)
        self.persisted += 1
        self._faults.after_episode_persisted(self._shard, self.persisted)
        return written


@contextlib.contextmanager
def _temporary_files_on_dev_full() -> Iterator[None]:
    """The store's temporary files (`tempfile.mkstemp` as `libero_eval.store` calls it) open
    /dev/full, so its writes get the kernel's ENOSPC as on a full disk."""

    def mkstemp(dir: str | Path, prefix: str, suffix: str) -> tuple[int, str]:
        return os.open("/dev/full", os.O_WRONLY), str(Path(dir) / f"{prefix}full{suffix}")

    real = store_module.tempfile
    store_module.tempfile = SimpleNamespace(mkstemp=mkstemp)  # type: ignore[assignment]
    try:
        yield
    finally:
        store_module.tempfile = real
