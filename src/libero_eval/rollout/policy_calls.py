"""A shard's policy calls: a few daemon threads, each with its own connection to the server.

The shard's loop (`runner.ShardRunner`) submits a request (its observations, or the request
already built for them) and goes on stepping envs; a thread sends it, parses the answer into
action chunks and queues the outcome (`Answer`), then wakes the loop through a socket that the
loop waits on beside its env workers' pipes (`wake_reader`). Anything else that must wake the
loop (the server's start found, `startup.ServerGate`) writes to the same socket (`wake`).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from libero_eval.failures import FailurePolicy
from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.connection import ConnectionSpec, PolicyConnection
from libero_eval.rollout.env_worker import Status

# (request id, [(worker, observation)], the request built as its observation came, or None)
Call = tuple[int, list[tuple[int, Observation]], Any]


class Answer(NamedTuple):
    """A policy call's outcome: `Status.OK` with the actions, or `Status.ERROR` with the
    exception; its wall time, when it came back and when it began to leave (monotonic)."""

    status: Status
    value: Any
    latency_s: float
    answered_at: float
    left_at: float


class CallPool:
    """A few daemon threads running `call` on what is submitted.

    Daemon threads, unlike ThreadPoolExecutor's, never hold up the exit of a failing shard
    while a request to a dead server waits for its timeout.
    """

    def __init__(self, size: int, call: Callable[[Any], None]):
        self._tasks: queue.Queue = queue.Queue()
        self._call = call
        self._threads = [
            threading.Thread(target=self._work, name=f"policy-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            self._call(task)

    def submit(self, task: Any) -> None:
        self._tasks.put(task)

    def close(self, wait: bool) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class PolicyCalls:
    """The shard's policy threads, their connections, and the queue of their answers."""

    def __init__(
        self,
        adapter: PolicyAdapter,
        connections: Callable[[ConnectionSpec, FailurePolicy], PolicyConnection],
        failures: FailurePolicy,
    ):
        self.adapter = adapter
        self._open = connections
        self._failures = failures
        self._spec: ConnectionSpec | None = None
        self._pool: CallPool | None = None
        self._local = threading.local()
        self._connections: list[PolicyConnection] = []
        self._connections_lock = threading.Lock()
        self._done: queue.Queue = queue.Queue()
        self.wake_reader, self._wake_writer = socket.socketpair()
        self.wake_reader.setblocking(False)

    @property
    def open(self) -> bool:
        """The threads run (the server is known)."""
        return self._pool is not None

    def start(self, spec: ConnectionSpec, threads: int) -> None:
        """Start `threads` policy threads talking to the server at `spec`."""
        self._spec = spec
        self._pool = CallPool(max(1, threads), self._call)

    def wake(self) -> None:
        """Wake the loop waiting on `wake_reader` (from any thread)."""
        self._wake_writer.send(b"x")

    def drain_wake(self) -> None:
        try:
            while True:
                self.wake_reader.recv(4096)
        except BlockingIOError:
            pass

    def build(self, observations: list[Observation]) -> Any:
        """The request of `observations`, or the exception building it raised (raised again
        by its policy call). A merged request is built as its observation comes: a batch's
        requests built at sending, one after another under the GIL, reach a merging server
        spread out (docs/performance.md, "Split batches")."""
        try:
            return self.adapter.build_request(observations, request_id=uuid.uuid4().hex)
        except Exception as exc:  # noqa: BLE001 - the episode's error, at its policy call
            return exc

    def submit(self, call: Call) -> None:
        assert self._pool is not None, "start() the policy threads first"
        self._pool.submit(call)

    def answers(self) -> Iterator[tuple[int, list[tuple[int, Observation]], Answer]]:
        """The calls that came back since the last look, as (request, batch, answer)."""
        while True:
            try:
                yield self._done.get_nowait()
            except queue.Empty:
                return

    def close(self, wait: bool) -> None:
        """Stop the threads; with `wait` (a shard that ends well) also close connections."""
        if self._pool is not None:
            self._pool.close(wait=wait)
        if wait:
            for connection in self._connections:
                connection.close()

    # -- on the policy threads -------------------------------------------------------------------
    def _connection(self) -> PolicyConnection:
        """This thread's connection to the server (one request at a time each)."""
        connection = getattr(self._local, "connection", None)
        if connection is None:
            assert self._spec is not None
            connection = self._open(self._spec, self._failures)
            self._local.connection = connection
            with self._connections_lock:
                self._connections.append(connection)
        return connection

    def _call(self, task: Call) -> None:
        request, batch, prebuilt = task
        observations = [obs for _, obs in batch]
        started = left = time.monotonic()
        try:
            payload = prebuilt if prebuilt is not None else self.build(observations)
            if isinstance(payload, Exception):
                raise payload
            left = time.monotonic()
            response = self._connection().infer(payload)
            actions = self.adapter.parse_response(response, len(observations))
            status, value = Status.OK, actions
        except Exception as exc:  # noqa: BLE001 - handed to the main loop to decide
            status, value = Status.ERROR, exc
        now = time.monotonic()
        self._done.put((request, batch, Answer(status, value, now - started, now, left)))
        self.wake()
