"""The reference server's compute model: one batch at a time, each taking a modelled latency.

A GPU policy server computes one batch at a time; a batch of n observations takes about
``fixed + per_item x n`` seconds (``server.reference.latency_fixed_s`` and
``latency_per_item_s``; both 0 turn the model off and only the serialization stays).
:class:`BatchSlot` stands in for that GPU. Requests reach it in one of two ways:

- :meth:`BatchSlot.run`: the request is a batch of its own (a family whose requests carry up
  to ``max_batch_size`` observations). Concurrent requests queue and are served one after
  the other, in arrival order; they are never merged.
- :meth:`BatchSlot.run_merged`: the request holds one observation (a family whose server
  merges requests itself, its metadata ``batch_inputs: false``). SGLang 0.5.23's
  dynamic batching (``--batching-mode dynamic``, ``--batching-delay-ms 0``) merges the
  requests waiting in its queue into one server batch of at most ``--batching-max-size``.
  Modelled the same way: a request arriving at an idle slot is computed alone at once; the
  requests arriving while a batch computes wait and are merged into the next batch, up to
  ``max_batch_size`` of them in arrival order, the rest into the batches after it. There is
  no delay that waits for a batch to fill.

The clock and the sleep are injected so that tests can follow the waits without racing real
time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timed:
    """A request's result with its batch's compute time and its own wait in the queue."""

    value: Any
    batch_size: int
    latency_s: float
    queued_s: float


@dataclass
class _Pending:
    compute: Callable[[], Any]
    arrived: float
    future: asyncio.Future = field(repr=False)


class BatchSlot:
    """One batch at a time, each taking at least ``fixed_s + per_item_s x n`` seconds of the
    injected clock; counts batches, requests, observations, busy and queued time."""

    def __init__(
        self,
        fixed_s: float,
        per_item_s: float,
        max_batch_size: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        offload: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.fixed_s = fixed_s
        self.per_item_s = per_item_s
        self.max_batch_size = max_batch_size
        self._clock = clock
        self._sleep = sleep
        # where the policy's (blocking) computation runs: a worker thread unless told otherwise
        self._offload = offload or (lambda compute: asyncio.to_thread(compute))
        self._lock = asyncio.Lock()
        self._waiting: list[_Pending] = []
        self.batches = 0
        self.requests = 0
        self.items = 0
        self.busy_s = 0.0
        self.queue_wait_s = 0.0

    def latency_s(self, batch_size: int) -> float:
        """The modelled time of a batch of ``batch_size`` observations."""
        return self.fixed_s + self.per_item_s * batch_size

    async def _compute_batch(self, compute: Callable[[], Any], items: int) -> tuple[Any, float]:
        """Under the lock: run ``compute`` and wait out the rest of the modelled latency."""
        started = self._clock()
        try:
            value = await self._offload(compute)
            remaining = self.latency_s(items) - (self._clock() - started)
            if remaining > 0:
                await self._sleep(remaining)
        finally:
            latency = self._clock() - started
            self.busy_s += latency
            self.batches += 1
        return value, latency

    async def run(self, compute: Callable[[], Any], items: int) -> Timed:
        """One request that is a batch of ``items`` observations, after those queued before."""
        arrived = self._clock()
        async with self._lock:
            queued = self._clock() - arrived
            self.queue_wait_s += queued
            value, latency = await self._compute_batch(compute, items)
        self.requests += 1
        self.items += items
        return Timed(value, items, latency, queued)

    async def run_merged(self, compute: Callable[[], Any]) -> Timed:
        """One single-observation request, merged with those waiting (see the module doc)."""
        pending = _Pending(compute, self._clock(), asyncio.get_running_loop().create_future())
        self._waiting.append(pending)
        try:
            async with self._lock:
                if not pending.future.done():  # not served in an earlier batch: lead this one
                    batch = self._waiting[: self.max_batch_size]
                    del self._waiting[: len(batch)]
                    await self._serve(batch)
        finally:
            if pending in self._waiting:  # cancelled while waiting
                self._waiting.remove(pending)
        return pending.future.result()

    async def _serve(self, batch: list[_Pending]) -> None:
        started = self._clock()
        for entry in batch:
            self.queue_wait_s += started - entry.arrived

        def compute_all() -> list[tuple[bool, Any]]:
            results: list[tuple[bool, Any]] = []
            for entry in batch:
                try:
                    results.append((True, entry.compute()))
                except Exception as exc:  # noqa: BLE001 - handed to that request alone
                    results.append((False, exc))
            return results

        try:
            results, latency = await self._compute_batch(compute_all, len(batch))
        except BaseException as exc:  # cancelled (or the sleep failed): so are its requests
            for entry in batch:
                if entry.future.done():
                    continue
                if isinstance(exc, Exception):
                    entry.future.set_exception(exc)
                else:
                    entry.future.cancel()
            raise
        self.requests += len(batch)
        self.items += len(batch)
        for entry, (ok, value) in zip(batch, results, strict=True):
            if ok:
                entry.future.set_result(Timed(value, len(batch), latency, started - entry.arrived))
            else:
                entry.future.set_exception(value)
