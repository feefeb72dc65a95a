"""The dispatcher alone: which ready observations leave in which request, and when.

Driven with plain numbers for time: the dispatcher reads no clock. The last tests run a small
discrete-event model of a shard (envs that step for a fixed time, a server that computes one
batch at a time in fixed + per-item seconds) and check the batches and the server's duty.
"""

import heapq

import pytest

from libero_eval.rollout.dispatch import LEAD_FRACTION, RATIOS_KEPT, Dispatcher, LatencyModel

COSMOS3 = LatencyModel(fixed_s=0.65, per_item_s=0.19)  # batch 1 in 0.84 s, batch 8 in 2.17 s


def dispatcher(**kwargs) -> Dispatcher:
    model = LatencyModel(**vars(COSMOS3))  # its own copy: answers change a model
    settings = {"max_batch": 8, "max_inflight": 2, "batch_timeout_s": 1.0, "model": model}
    return Dispatcher(**(settings | kwargs))


def test_latency_model_is_the_line_through_the_smallest_and_largest_probe():
    capacity = {
        "probes": [
            {"observations": 1, "requests": 1, "seconds": 0.84},
            {"observations": 8, "requests": 1, "seconds": 2.16},
        ]
    }
    model = LatencyModel.from_capacity(capacity)
    assert model.per_item_s == pytest.approx(1.32 / 7)
    assert model.seconds(1) == pytest.approx(0.84)
    assert model.seconds(8) == pytest.approx(2.16)
    assert LatencyModel.from_capacity(None) is None
    assert LatencyModel.from_capacity({"probes": []}) is None


def test_answers_slower_than_measured_scale_the_model_up():
    model = LatencyModel(0.5, 0.25)
    model.observe(2, 2.0)  # predicted 1.0
    assert 1.0 < model.scale < 2.0
    assert model.seconds(2) == pytest.approx(model.scale)


def test_the_typical_model_leaves_out_the_first_answers_that_captured_cuda_graphs():
    # π0.5 on one H200 (docs/measurements/h200-2026-12-03c, the LeRobot run): the probe's
    # line gives a batch of 16 in 0.25 s; a new batch size's first answer also captures its
    # CUDA graph (2-4 s). The running correction followed them to 0.47 s a batch.
    model = LatencyModel(fixed_s=0.058, per_item_s=0.0123)
    assert model.typical().seconds(16) == pytest.approx(model.seconds(16))  # none yet
    for service_s in (0.27, 3.1, 0.26, 0.28, 2.4, 0.27, 0.29, 0.27, 2.8, 0.28):
        model.observe(16, service_s)
    assert model.seconds(16) > 0.45  # the running correction: the last captures dominate
    assert model.typical().seconds(16) == pytest.approx(0.27, abs=0.005)  # the in-band median
    assert model.typical().ratios == ()  # a copy with the scale, not the answers


def test_the_typical_model_leaves_out_captures_and_merged_answers_even_when_most():
    # The LeRobot run of docs/measurements/h100-2026-12-07b (one H100, π0.5 at a merging
    # server): its first five batches, each one's time at the server, answer to answer. Two
    # held a CUDA graph capture, one came back with the batch before it (SGLang merged it
    # there), one more held part of a capture; only one ran at the probe's pace. A median of
    # all of them read a batch of 16 in 0.43 s against the probe's 0.23 s.
    model = LatencyModel(fixed_s=0.06176, per_item_s=0.01024)
    for observations, service_s in ((16, 0.932), (16, 0.001), (16, 0.623), (5, 0.370), (13, 0.199)):
        model.observe(observations, service_s)
    assert model.typical().seconds(16) == pytest.approx(0.23, abs=0.005)
    for _ in range(3):
        model.observe(16, 2.5)  # nothing within the band: the probe's line
    model.ratios = model.ratios[-3:]
    assert model.typical().scale == 1.0


def test_the_typical_model_follows_the_last_answers_kept():
    model = LatencyModel(fixed_s=0.0, per_item_s=0.1)
    for _ in range(200):
        model.observe(1, 0.3)  # slow answers, then many at the line
    for _ in range(RATIOS_KEPT):
        model.observe(1, 0.1)
    assert len(model.ratios) == RATIOS_KEPT
    assert model.typical().scale == pytest.approx(1.0)


def test_a_full_batch_leaves_at_once_and_takes_the_oldest_first():
    d = dispatcher()
    for worker in range(10):
        d.ready(worker, "pick the bowl", now=float(worker))
    assert d.due(now=10.0, coming={"pick the bowl": 0}) == [
        (1, list(range(8))),
        (2, [8, 9]),  # nothing more is coming for this prompt: it leaves too
    ]
    assert d.inflight == 2 and d.waiting == 0


def test_no_request_leaves_without_a_free_slot():
    d = dispatcher(max_inflight=1)
    for worker in range(16):
        d.ready(worker, "a" if worker < 8 else "b", now=0.0)
    assert [len(w) for _, w in d.due(0.0, {})] == [8]
    assert d.due(0.5, {}) == []
    d.answered(1, now=2.2)
    assert [w for _, w in d.due(2.2, {})] == [list(range(8, 16))]


def test_a_partial_batch_waits_while_the_server_is_busy_until_it_is_about_to_finish():
    d = dispatcher()
    for worker in range(8):
        d.ready(worker, "a", now=0.0)
    ((request, _),) = d.due(0.0, {})
    d.ready(8, "b", now=0.1)  # its 7 siblings still step
    assert d.due(0.1, {"b": 7}) == []
    finish = COSMOS3.seconds(8)
    lead = LEAD_FRACTION * COSMOS3.seconds(8)
    assert d.busy_until() == pytest.approx(finish)
    assert d.next_decision(0.1) == pytest.approx(finish - lead - 0.1)
    d.ready(9, "b", now=1.0)
    assert d.due(finish - lead - 0.01, {"b": 6}) == []
    assert d.due(finish - lead, {"b": 6}) == [(2, [8, 9])]  # the server must not idle


def test_a_partial_batch_at_an_idle_server_waits_for_its_siblings_at_most_the_fixed_cost():
    d = dispatcher()
    d.ready(0, "a", now=0.0)
    assert d.hold_s == pytest.approx(COSMOS3.fixed_s)
    assert d.due(0.3, {"a": 3}) == []
    d.ready(1, "a", now=0.4)
    d.ready(2, "a", now=0.5)
    assert d.next_decision(0.5) == pytest.approx(COSMOS3.fixed_s - 0.5)
    assert d.due(COSMOS3.fixed_s, {"a": 1}) == [(1, [0, 1, 2])]


def test_without_a_measured_model_the_batch_timeout_holds_and_the_first_answer_teaches():
    d = dispatcher(model=None, batch_timeout_s=1.0)
    d.ready(0, "a", now=0.0)
    assert d.due(0.9, {"a": 1}) == []
    assert d.due(1.0, {"a": 1}) == [(1, [0])]
    d.ready(1, "a", now=1.1)
    assert d.next_decision(1.1) is None  # busy for an unknown time: wait for the answer
    assert d.due(1.5, {"a": 1}) == []
    d.answered(1, now=1.8)
    assert d.model is not None and d.model.seconds(1) == pytest.approx(0.8)


def test_one_observation_per_request_leaves_at_once():
    # π0.5: the server takes one observation per request and merges requests itself
    d = dispatcher(max_batch=1, max_inflight=32)
    for worker in range(5):
        d.ready(worker, f"task {worker % 2}", now=0.0)
    assert sorted(w[0] for _, w in d.due(0.0, {"task 0": 10, "task 1": 10})) == list(range(5))


# -- a shard as a discrete-event model -------------------------------------------------------------


def simulate(
    envs: int,
    prompt_of: list[str],
    step_s: list[float],
    first_ready: list[float],
    model: LatencyModel,
    max_batch: int,
    max_inflight: int,
    rounds: int,
) -> tuple[list[int], float]:
    """Envs that take `step_s[i]` to step a chunk, a server that computes one request at a
    time in `model.seconds(n)`; each env asks `rounds` times. Returns the request sizes in
    order and the server's busy fraction between its first start and last finish."""
    d = Dispatcher(max_batch, max_inflight, batch_timeout_s=1.0, model=LatencyModel(**vars(model)))
    events = [(t, "ready", i) for i, t in enumerate(first_ready)]
    heapq.heapify(events)
    asked = [0] * envs
    queued: set[int] = set()
    server_free_at, queue, sizes, busy = 0.0, [], [], 0.0
    first_start = None
    now = 0.0
    while events or queue:
        wake = d.next_decision(now)
        if events and (wake is None or events[0][0] <= now + wake):
            now, kind, data = heapq.heappop(events)
            if kind == "ready":
                d.ready(data, prompt_of[data], now)
                queued.add(data)
            else:  # the server answered request `data` = (id, workers)
                request, workers = data
                d.answered(request, now)
                for worker in workers:
                    asked[worker] += 1
                    if asked[worker] < rounds:
                        heapq.heappush(events, (now + step_s[worker], "ready", worker))
        elif wake is not None:
            now += wake
        coming = {}  # envs that will ask again and are not queued
        for worker, prompt in enumerate(prompt_of):
            if asked[worker] < rounds and worker not in queued:
                coming[prompt] = coming.get(prompt, 0) + 1
        for request, workers in d.due(now, coming):
            queued.difference_update(workers)
            start = max(now, server_free_at)
            first_start = start if first_start is None else first_start
            server_free_at = start + model.seconds(len(workers))
            busy += model.seconds(len(workers))
            sizes.append(len(workers))
            heapq.heappush(events, (server_free_at, "answer", (request, workers)))
        queue = []
    return sizes, busy / (server_free_at - first_start)


def test_two_prompts_of_eight_keep_a_slower_server_busy_with_full_batches():
    sizes, duty = simulate(
        envs=16,
        prompt_of=["a"] * 8 + ["b"] * 8,
        step_s=[0.5 + 0.01 * i for i in range(16)],
        first_ready=[3.0 + 0.1 * i for i in range(16)],  # resets end at different times
        model=COSMOS3,
        max_batch=8,
        max_inflight=2,
        rounds=15,
    )
    # resets spread over 0.7 s, more than the idle server's hold (its fixed cost, 0.65 s):
    # the first request leaves with 7; the late env joins the next one of its prompt, and
    # after the start every request is full until the late env's last round
    assert sizes[0] == 7 and sizes[1:-1] == [8] * 29 and sizes[-1] == 1
    assert duty > 0.99


def test_a_straggler_joins_its_groups_next_batch_instead_of_travelling_alone():
    # 8 envs of one prompt; env 7's reset ends 1.5 s after the others'. The old dispatch sent
    # 7 + 1 for the whole run; here the straggler waits for the next batch of its prompt.
    sizes, _ = simulate(
        envs=16,
        prompt_of=["a"] * 8 + ["b"] * 8,
        step_s=[0.5] * 16,
        first_ready=[3.0] * 7 + [4.5] + [3.0] * 8,
        model=COSMOS3,
        max_batch=8,
        max_inflight=2,
        rounds=15,
    )
    assert sizes.count(8) >= len(sizes) - 2  # at most the first round is split
    assert 1 not in sizes[2:]
    assert sum(sizes) == 16 * 15


def test_envs_stepping_slower_than_the_server_get_it_to_send_what_is_ready():
    # the env side is the bottleneck: batches may be partial, but each leaves once its
    # prompt has no env stepping or the idle server's hold has passed; nothing is lost
    sizes, _ = simulate(
        envs=4,
        prompt_of=["a", "a", "b", "b"],
        step_s=[3.0, 3.5, 3.0, 9.0],
        first_ready=[0.0, 0.2, 0.0, 0.3],
        model=COSMOS3,
        max_batch=8,
        max_inflight=2,
        rounds=5,
    )
    assert sum(sizes) == 4 * 5


# -- a server that merges one-observation requests itself (π0.5 on SGLang) -------------------------

PI05 = LatencyModel(fixed_s=0.131, per_item_s=0.0096)  # one H200 beside 32 envs: 16 in 0.285 s


def merging_dispatcher(**kwargs) -> Dispatcher:
    settings = {
        "max_batch": 16,
        "max_inflight": 2,
        "batch_timeout_s": 1.0,
        "model": LatencyModel(**vars(PI05)),
        "as_ready": True,
    }
    return Dispatcher(**(settings | kwargs))


def test_a_busy_merging_server_gets_each_ready_observation_at_once():
    d = merging_dispatcher()
    for worker in range(16):
        d.ready(worker, "", now=0.0)
    assert [len(w) for _, w in d.due(0.0, {"": 16})] == [16]
    # the server computes those 16: a ready observation waits in its queue, not the shard's,
    # so that it joins the server's next batch with the others that come meanwhile
    d.ready(16, "", now=0.1)
    assert d.due(0.1, {"": 15}) == [(2, [16])]
    d.ready(17, "", now=0.12)
    d.ready(18, "", now=0.12)
    assert d.due(0.12, {"": 13}) == [(3, [17, 18])]
    # the same at a server that does not merge: the partial batch waits for its siblings
    plain = merging_dispatcher(as_ready=False)
    for worker in range(17):
        plain.ready(worker, "", now=0.0)
    assert [len(w) for _, w in plain.due(0.0, {"": 15})] == [16]
    assert plain.due(0.1, {"": 15}) == []


def test_a_merging_servers_slots_count_observations():
    d = merging_dispatcher(max_batch=4, max_inflight=2)  # 8 observations at the server at once
    for worker in range(6):
        d.ready(worker, "", now=0.0)
    assert [len(w) for _, w in d.due(0.0, {"": 6})] == [4, 2]
    for worker in range(6, 9):
        d.ready(worker, "", now=0.05)
    assert d.due(0.05, {"": 3}) == [(3, [6, 7])]  # room for 2 more, not a third request
    assert d.inflight_observations == 8 and d.waiting == 1 and d.next_decision(0.05) is None
    d.answered(1, now=0.2)
    assert d.due(0.2, {"": 7}) == [(4, [8])]


def test_an_idle_merging_server_waits_for_a_batchs_siblings():
    # nothing in flight: the first ready observation would start a batch of one
    d = merging_dispatcher()
    d.ready(0, "", now=0.0)
    assert d.due(0.0, {"": 15}) == []
    assert d.next_decision(0.0) == pytest.approx(PI05.fixed_s)  # its hold: the fixed cost
    for worker in range(1, 16):
        d.ready(worker, "", now=0.01)
    assert [len(w) for _, w in d.due(0.01, {"": 16})] == [16]


def simulate_merging(as_ready: bool, step_s: list[float], rounds: int) -> tuple[float, float]:
    """Envs that step for `step_s[i]`, a server that starts its next batch with every request
    queued when it is free (up to 16) and takes `PI05.seconds(n)` for it. Returns the server's
    mean batch and its observations per second."""
    envs = len(step_s)
    d = merging_dispatcher(as_ready=as_ready)
    events = [(0.001 * i, "ready", i) for i in range(envs)]
    heapq.heapify(events)
    asked, queue, batches = [0] * envs, [], []
    requests: dict[int, set[int]] = {}
    free_at, now = 0.0, 0.0
    while events:
        wake = d.next_decision(now)
        if wake is not None and now + wake < events[0][0]:
            now += wake
        else:
            now, kind, data = heapq.heappop(events)
            if kind == "ready":
                d.ready(data, "", now)
            else:  # the server answered the workers of one of its batches
                for request, worker in data:
                    requests[request].discard(worker)
                    if not requests[request]:
                        d.answered(request, now)
                    asked[worker] += 1
                    if asked[worker] < rounds:
                        heapq.heappush(events, (now + step_s[worker], "ready", worker))
        coming = {"": sum(1 for n in asked if n < rounds)}
        for request, workers in d.due(now, coming):
            requests[request] = set(workers)
            queue.extend((request, worker) for worker in workers)
        if queue and free_at <= now:
            batch, queue = queue[:16], queue[16:]
            free_at = now + PI05.seconds(len(batch))
            batches.append(len(batch))
            heapq.heappush(events, (free_at, "answer", batch))
    return sum(batches) / len(batches), sum(batches) / now


def test_merging_dispatch_fills_the_servers_batches_where_envs_step_about_as_long():
    # 32 envs stepping 0.20-0.26 s, about what a batch of 16 takes: sent as batches of 16 the
    # groups fragment (two requests in flight, a partial one at the server while the rest of
    # its group waits in the shard); sent as they are ready, they join the server's next batch
    step_s = [0.20 + 0.06 * ((7 * i) % 32) / 31 for i in range(32)]
    batched = simulate_merging(False, step_s, rounds=40)
    merged = simulate_merging(True, step_s, rounds=40)
    assert merged[0] > batched[0] + 1 and merged[1] > batched[1] * 1.04
    assert merged[1] > 0.9 * 16 / PI05.seconds(16)
