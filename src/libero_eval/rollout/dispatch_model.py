"""A shard as a discrete-event model: envs that step, a server that computes batches.

The model runs the real `dispatch.Dispatcher` against envs that take a given time to step a
query and a server that computes one batch at a time in `LatencyModel.seconds(n)`. A server
that merges one-observation requests (SGLang's dynamic batching, a family whose metadata says
``batch_inputs: false``) starts its next batch with every request queued when it is free, up
to its batch size (the reference server's `reference/batching.py` too); one that does not
computes one request of up to its batch, of one prompt, at a time. It is pure: no clock, no
process, plain numbers in and out, so a shard can run it on its own measurements to choose
its dispatch and env count (`rollout.auto`), and tests can check it against what was measured
on real runs (docs/rfcs/0008-dispatch.md, "auto").
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from libero_eval.rollout.dispatch import Dispatcher, LatencyModel


@dataclass(frozen=True)
class ModelResult:
    """What the model's server did: observations per second from the first request to the
    last answer, and its batches' mean size."""

    obs_per_s: float
    mean_batch: float
    batches: int


def simulate(
    step_s: Sequence[Sequence[float]],
    model: LatencyModel,
    server_batch: int,
    *,
    merging: bool,
    as_ready: bool = False,
    max_inflight: int | None = None,
    rounds: int = 30,
    prompts: Sequence[int] | None = None,
    batch_timeout_s: float,
) -> ModelResult:
    """Run `len(step_s)` envs for `rounds` queries each. Env i's k-th step takes
    `step_s[i][k % len(step_s[i])]` seconds (its measured samples, in turn); all are ready
    at 0 with their first observation. `prompts[i]`: env i's prompt (a request carries one
    at a server that does not merge; default: groups of `server_batch` envs, as the
    scheduler packs them). `max_inflight`: the dispatcher's slots (None: as the runner sets
    them, ceil(envs / server_batch)); `batch_timeout_s`: `rollout.batch_timeout_s`."""
    envs = len(step_s)
    if envs == 0:
        return ModelResult(0.0, 0.0, 0)
    prompt_of = list(prompts) if prompts is not None else [i // server_batch for i in range(envs)]
    if merging:
        prompt_of = [0] * envs  # one queue: a merging server's batch mixes prompts
    slots = max_inflight or -(-envs // server_batch)
    d = Dispatcher(
        server_batch,
        slots,
        batch_timeout_s,
        LatencyModel(model.fixed_s, model.per_item_s, model.scale),
        as_ready and merging,
    )
    events: list[tuple[float, int, str, object]] = []
    order = 0  # ties keep their push order

    def push(time: float, kind: str, data: object) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (time, order, kind, data))

    for i in range(envs):
        push(0.0, "ready", i)
    asked = [0] * envs
    queued: set[int] = set()
    server_queue: list[tuple[int, list[int]]] = []  # (request, workers) as they arrive
    parts_left: dict[int, int] = {}
    free_at, now = 0.0, 0.0
    first_start: float | None = None
    sizes: list[int] = []
    while events or server_queue:
        wake = d.next_decision(now)
        if events and (wake is None or events[0][0] <= now + wake):
            now, _, kind, data = heapq.heappop(events)
            if kind == "ready":
                assert isinstance(data, int)
                d.ready(data, prompt_of[data], now)
                queued.add(data)
            else:  # a batch is back: (request, workers) of each of its requests
                assert isinstance(data, list)
                for request, workers in data:
                    parts_left[request] -= 1
                    if not parts_left[request]:
                        del parts_left[request]
                        d.answered(request, now)
                    for worker in workers:
                        asked[worker] += 1
                        if asked[worker] < rounds:
                            samples = step_s[worker]
                            step = samples[(asked[worker] - 1) % len(samples)]
                            push(now + step, "ready", worker)
        elif wake is not None:
            now += wake
        else:
            break  # nothing can happen any more (cannot be reached with rounds > 0)
        coming: dict[int, int] = {}
        for worker, prompt in enumerate(prompt_of):
            if asked[worker] < rounds and worker not in queued:
                coming[prompt] = coming.get(prompt, 0) + 1
        for request, workers in d.due(now, coming):
            queued.difference_update(workers)
            if merging:  # one request per observation, merged at the server
                parts_left[request] = len(workers)
                server_queue.extend((request, [worker]) for worker in workers)
            else:
                parts_left[request] = 1
                server_queue.append((request, workers))
        if server_queue and free_at <= now:
            if merging:
                batch, server_queue = server_queue[:server_batch], server_queue[server_batch:]
            else:
                batch, server_queue = server_queue[:1], server_queue[1:]
            n = sum(len(workers) for _, workers in batch)
            first_start = now if first_start is None else first_start
            free_at = now + model.seconds(n)
            sizes.append(n)
            push(free_at, "answer", batch)
    span = free_at - (first_start or 0.0)
    total = sum(sizes)
    return ModelResult(total / span if span > 0 else 0.0, total / max(1, len(sizes)), len(sizes))
