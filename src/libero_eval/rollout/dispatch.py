"""When a shard sends its ready observations, and how many go in one request.

The server is the expensive part: it should never idle while observations wait, and each
request should carry as many observations as it can take (a request holds one prompt, so
observations are queued per prompt). The dispatcher keeps one ready-queue per prompt key and a
number of request slots (`max_inflight`: requests at the server at once, one computing and the
rest queued behind it). It decides, for a given time, which batches to send:

- a queue that holds a full batch (`max_batch`), or whose prompt has no other env that will
  be ready again (stepping, resetting or awaiting an answer), is sent as soon as a slot is
  free;
- a partial batch waits for those siblings while the server is busy anyway: it is sent
  only when the server is expected to finish its work in flight (`LatencyModel`, measured at
  server start and refined from the run's own answers) less a short lead;
- with the server idle, a partial batch waits at most `hold_s` for its siblings: about the
  server's fixed cost per request, which is what a second, late request would cost.

So a straggler joins the next batch of its prompt instead of travelling alone, and a group of
envs cannot settle into a pattern of 7 + 1. With `max_batch` 1 every observation is a full
batch and leaves at once.

A server that merges requests itself (SGLang's dynamic batching: one observation a request,
merged up to its `--batching-max-size`, here `max_batch`) starts its next batch with every
request queued when the current one ends. With `as_ready` (`rollout.merged_dispatch: as_ready`),
while it is busy a ready observation leaves at once to wait in the server's queue, where it
joins the next batch, rather than in the shard's, where it would miss it; only an idle server's
partial batch waits (`hold_s`) for its siblings, so that a batch does not start with the first
of them. The slots then count observations: `max_inflight` batches' worth at the server at once.
Where the envs are about as slow as the server this starts batches with the first observation
of a group, and the default (a batch at once, a partial one when the server is expected to
finish) does better (docs/performance.md, "The merging dispatch").

The class is pure: the runner tells it what happened and when (`now`), and asks what is due.
Nothing here sleeps or reads a clock, so tests drive it with plain numbers.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any

LEAD_FRACTION = 0.1  # send a partial batch this part of a request's service time early
MIN_LEAD_S = 0.02  # and at least this early (encoding, transfer, the server's preprocessing)
SMOOTHING = 0.2  # weight of each new answer in the latency model's running correction
RATIOS_KEPT = 128  # answers whose median `LatencyModel.typical` takes (a shard's first queries)
# `LatencyModel.typical` leaves out answers more than this factor off the probe's line: a CUDA
# graph captured for a new batch size (2-16x for π0.5), or a merging server's answer that came
# back with an earlier batch (near 0). A server's full batches beside its envs took 7-20% longer
# than at its probe (docs/measurements/h100-2026-12-07b), well inside it.
TYPICAL_BAND = 1.5


@dataclass
class LatencyModel:
    """A server's service time for a request of n observations: fixed + per_item x n, times
    a running correction learned from the run's own answers."""

    fixed_s: float
    per_item_s: float
    scale: float = 1.0
    # the last answers' service times over the line's prediction, in order (`typical`)
    ratios: tuple[float, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_capacity(cls, capacity: Mapping[str, Any] | None) -> LatencyModel | None:
        """The line through the capacity probes of the service file (smallest and largest
        batch), or None when there is no usable probe."""
        probes = [
            p
            for p in (capacity or {}).get("probes", [])
            if p.get("observations", 0) > 0 and p.get("seconds", 0) > 0
        ]
        if not probes:
            return None
        small = min(probes, key=lambda p: p["observations"])
        large = max(probes, key=lambda p: p["observations"])
        if large["observations"] == small["observations"]:
            return cls(0.0, small["seconds"] / small["observations"])
        per_item = max(
            0.0,
            (large["seconds"] - small["seconds"]) / (large["observations"] - small["observations"]),
        )
        return cls(max(0.0, small["seconds"] - per_item * small["observations"]), per_item)

    def seconds(self, observations: int) -> float:
        return self.scale * (self.fixed_s + self.per_item_s * observations)

    def observe(self, observations: int, service_s: float) -> None:
        """Fold one answer's service time (its time at the server, queueing excluded) in."""
        predicted = self.fixed_s + self.per_item_s * observations
        if predicted > 0 and service_s > 0:
            self.scale += SMOOTHING * (service_s / predicted - self.scale)
            self.ratios = (*self.ratios[1 - RATIOS_KEPT :], service_s / predicted)

    def typical(self) -> LatencyModel:
        """The line scaled by the median of the last answers' ratios that lie within
        `TYPICAL_BAND` of it (the probe's line where none do): what a choice made once is
        based on. A running correction follows the last few answers; a run's first ones hold
        the CUDA graphs the server captures for each batch size it has not seen (2-4 s against
        a batch's 0.25 s for π0.5 on one H200: docs/measurements/h200-2026-12-03c), and at a
        merging server part of a batch comes back with the one before (SGLang merged it
        there), a few ms after it. Both can be most of a shard's first answers (the LeRobot
        run of docs/measurements/h100-2026-12-07b read a batch of 16 in 0.43 s against its
        0.23 s), so both are left out, not outvoted."""
        kept = [r for r in self.ratios if 1 / TYPICAL_BAND <= r <= TYPICAL_BAND]
        scale = median(kept) if kept else 1.0
        return LatencyModel(self.fixed_s, self.per_item_s, scale)


@dataclass
class _Request:
    sent_at: float
    observations: int


@dataclass
class Dispatcher:
    """Per-prompt ready-queues and request slots; decides which batches leave when."""

    max_batch: int  # observations one request may carry (the server's max batch size)
    max_inflight: int  # requests at the server at once
    batch_timeout_s: float  # a partial batch never waits longer at an idle server
    model: LatencyModel | None = None  # None until measured (probe or first answer)
    as_ready: bool = False  # a merging server: each observation leaves as it is ready
    _ready: dict[Hashable, list[tuple[int, float]]] = field(default_factory=dict)
    _inflight: dict[int, _Request] = field(default_factory=dict)
    _next_id: int = 0
    _last_answer_at: float = float("-inf")

    # -- what happened ----------------------------------------------------------------------------
    def ready(self, worker: int, key: Hashable, now: float) -> None:
        """`worker` holds an observation for prompt `key`, ready since `now`."""
        self._ready.setdefault(key, []).append((worker, now))

    def answered(self, request: int, now: float) -> None:
        """Request `request` came back (answer or error) at `now`."""
        sent = self._inflight.pop(request)
        if self.model is None:
            if now > sent.sent_at:  # nothing measured before: all of it per item
                self.model = LatencyModel(0.0, (now - sent.sent_at) / sent.observations)
        elif not self.as_ready:  # a merging server's batch holds requests sent apart
            started = max(sent.sent_at, self._last_answer_at)  # the server works serially
            self.model.observe(sent.observations, now - started)
        self._last_answer_at = max(self._last_answer_at, now)

    # -- what to do -------------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        """Requests sent and not answered."""
        return len(self._inflight)

    @property
    def inflight_observations(self) -> int:
        """Observations sent and not answered."""
        return sum(request.observations for request in self._inflight.values())

    def _room(self) -> int:
        """Observations that may leave now: with `as_ready` the slots count observations,
        else requests of up to `max_batch`."""
        if self.as_ready:
            return self.max_inflight * self.max_batch - self.inflight_observations
        return self.max_batch if self.inflight < self.max_inflight else 0

    @property
    def waiting(self) -> int:
        """Observations ready and not yet sent."""
        return sum(len(queue) for queue in self._ready.values())

    @property
    def hold_s(self) -> float:
        """How long a partial batch waits for its siblings at an idle server: the server's
        fixed cost per request (what sending now costs in one more request later), at most
        `batch_timeout_s`."""
        if self.model is None:
            return self.batch_timeout_s
        return min(self.batch_timeout_s, self.model.fixed_s * self.model.scale)

    def busy_until(self) -> float | None:
        """When the server is expected to be done with every request in flight (None: idle,
        or busy for an unknown time because nothing has been measured yet)."""
        if not self._inflight or self.model is None:
            return None
        end = self._last_answer_at
        for request in sorted(self._inflight.values(), key=lambda r: r.sent_at):
            end = max(end, request.sent_at) + self.model.seconds(request.observations)
        return end

    def _partial_may_leave_at(self, oldest: float) -> float | None:
        """When a partial batch whose oldest observation is from `oldest` may leave (None:
        not before an answer comes back)."""
        if not self._inflight:
            return oldest + self.hold_s
        end = self.busy_until()
        if end is None:
            return None
        assert self.model is not None
        lead = max(MIN_LEAD_S, LEAD_FRACTION * self.model.seconds(self.max_batch))
        return end - lead

    def _pick(self, now: float, coming: Mapping[Hashable, int]) -> Hashable | None:
        """The prompt whose batch leaves next, if one may leave now: a complete one (full,
        or nothing more coming) first, the largest and then the longest waiting; else the
        largest partial one once its time has come."""

        def order(key: Hashable) -> tuple[int, float]:
            queue = self._ready[key]
            return (-min(len(queue), self.max_batch), queue[0][1])

        keys = sorted(self._ready, key=order)
        if self.as_ready and self._inflight:
            return keys[0]  # the server is busy: wait in its queue, to join its next batch
        complete = [
            k for k in keys if len(self._ready[k]) >= self.max_batch or not coming.get(k, 0)
        ]
        if complete:
            return complete[0]
        leave_at = self._partial_may_leave_at(self._ready[keys[0]][0][1])
        return keys[0] if leave_at is not None and now >= leave_at else None

    def due(self, now: float, coming: Mapping[Hashable, int]) -> list[tuple[int, list[int]]]:
        """The requests to send now, as (request id, workers oldest first), each taking a
        free slot and counted in flight from `now`; `coming[key]`: the other envs running
        prompt `key`, whose observations will come (stepping, resetting, or awaiting an
        answer)."""
        requests: list[tuple[int, list[int]]] = []
        while self._ready and (room := self._room()) > 0:
            key = self._pick(now, coming)
            if key is None:
                break
            queue = self._ready[key]
            size = min(room, self.max_batch)
            workers = [worker for worker, _ in queue[:size]]
            del queue[:size]
            if not queue:
                del self._ready[key]
            self._next_id += 1
            self._inflight[self._next_id] = _Request(now, len(workers))
            requests.append((self._next_id, workers))
        return requests

    def next_decision(self, now: float) -> float | None:
        """Seconds until a held partial batch may leave with no new event (None: only an
        event, an answer or a ready observation, can change what is due)."""
        if not self._ready or self._room() <= 0:
            return None
        oldest = min(queue[0][1] for queue in self._ready.values())
        leave_at = self._partial_may_leave_at(oldest)
        return None if leave_at is None else max(0.0, leave_at - now)
