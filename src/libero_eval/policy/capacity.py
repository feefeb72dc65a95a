"""A policy server's own capacity, measured once at its start: latency at batch 1 and at its
largest batch, and the best observations per second of the two.

The serve job runs the probe once the server answers its readiness path, before it announces
the server ready (`libero_eval.serve.job`), and records the result in the slot's service file
under ``"capacity"``; a rollout reads it back with `libero_eval.service.capacity_of`. The entry:

    {"max_batch_size": 8,
     "probes": [{"observations": 1, "requests": 1, "seconds": 0.84},
                {"observations": 8, "requests": 1, "seconds": 2.16}],
     "obs_per_s": 3.70}

``seconds`` is the mean of :data:`TIMED_CALLS` calls after :data:`WARMUP_CALLS` untimed ones,
and ``obs_per_s`` the largest ``observations / seconds``. The largest batch is what one request
may carry (``PolicyConnection.max_batch_size()``, Cosmos3: one request of that many
observations); for a family whose requests hold one observation each (π0.5) it is the number of
concurrent requests the server merges into one batch (SGLang's ``--batching-max-size``, the
reference server's ``max_batch_size``), each on its own connection (``requests`` =
``observations``). Such a server is probed as the workflow's envs would load it if they took
no time to step: a closed loop of :data:`CLOSED_LOOP_BATCHES` batches' worth of requesters, each
sending :data:`CLOSED_LOOP_ROUNDS` requests one after another, so that while one batch computes
the next is already queued (`benchmarks/sglang_server.py --saturate`, the server-alone figure of
docs/performance.md). Each requester's cycle is timed from its first answer to its last, which
leaves out the first round (it started at an idle server, which splits what reaches it one
after another: measured on an H200, 16 + 12 + 4); ``seconds`` is ``observations`` over the sum
of the requesters' rates. (The probe before it sent three batches' worth at once, and read
0.30-0.33 s a batch of 16 on H200s where the closed loop gave 0.24 s.)

The requests are synthetic: grey camera frames of the run's size, a robot at rest, a LIBERO
task's sentence, and (when the run sends privileged state, for the reference server's scripted
expert) a scene with nothing to do. Their actions are discarded.

**CUDA graphs before ready.** SGLang's π0.5 pipeline captures a CUDA graph of its denoising
step the first time a batch of a new size (and prompt length) comes
(`sglang/multimodal_gen/runtime/vla/cuda_graph.py` ``VLADenoiseGraphRunner.capture_or_run``,
keyed by ``VLADenoiseGraphSignature``: batch size, prefix length, ...); nothing in its
pipeline config captures them up front (``Pi05PipelineConfig``: only capacities and prompt
buckets). Each capture stalls the batch that meets it, about half a second on an H200. With
``graph_batches`` (the family's, `Family.graph_batches`: where the prompts are padded to
buckets, a graph per batch size) the probe first sends each of those merged batch sizes once
(:func:`warm_graphs`): a request the server starts alone, and while it computes, ``k``
requests together, which SGLang's scheduler takes as one batch of ``k``
(`runtime/managers/scheduler.py` ``get_next_batch_to_run``: the queue's compatible requests,
up to ``--batching-max-size``). A size whose batch the server split is sent again in the
next round, while the serve log (``captured``) says it is missing. The timed probes then
need no untimed call of their own: the graphs, and the kernels behind them, are warm.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from libero_eval.policy import families
from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.connection import PolicyConnection, connect, policy_connection_spec
from libero_eval.policy.families import make_adapter

WARMUP_CALLS = 1  # untimed calls before the timed ones (none after a graph warm-up)
TIMED_CALLS = 2
CLOSED_LOOP_BATCHES = 2  # a merging server's closed loop: batches' worth of requesters
CLOSED_LOOP_ROUNDS = 4  # requests each requester sends, one after another
# a LIBERO task's own sentence (libero_spatial task 0): its prompt has the length of a run's,
# so it lands in the run's prompt bucket (SGLang π0.5's prompt_token_buckets)
PROBE_TASK = "pick up the black bowl between the plate and the ramekin and place it on the plate"
GRAPH_ROUNDS = 3  # rounds of the graph warm-up: a size the server split is sent again
# the pause between the request the server starts alone and the batch that queues behind it
GRAPH_LEAD_S = 0.02


def synthetic_observation(camera_size: int, privileged_state: bool = False) -> Observation:
    """One observation of the shape a LIBERO env gives: grey ``uint8[size, size, 3]`` frames, a
    robot at rest (proprioception), and with ``privileged_state`` a scene with no objects and no
    goal (the scripted expert holds)."""
    frame = np.full((camera_size, camera_size, 3), 128, dtype=np.uint8)
    eef_pos, eef_quat, gripper_qpos = [0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.04, -0.04]
    state = None
    if privileged_state:
        robot = {"eef_pos": eef_pos, "eef_quat": eef_quat, "gripper_qpos": gripper_qpos}
        state = {"robot": robot, "objects": {}, "goal": [], "goal_satisfied": []}
    return Observation(
        agentview=frame,
        wrist=frame.copy(),
        task_language=PROBE_TASK,
        privileged_state=state,
        proprio={
            "robot0_eef_pos": np.asarray(eef_pos),
            "robot0_eef_quat": np.asarray(eef_quat),
            "robot0_gripper_qpos": np.asarray(gripper_qpos),
        },
    )


def measure_capacity(
    connect_once: Callable[[], PolicyConnection],
    adapter: PolicyAdapter,
    observation: Observation,
    merged_batch_size: int = 1,
    *,
    warmup: int = WARMUP_CALLS,
    timed: int = TIMED_CALLS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The capacity entry (module doc) of the server ``connect_once()`` connects to.

    ``merged_batch_size``: for a server whose requests hold one observation, how many it merges
    into one batch. Raises whatever a failed request raises."""
    connections: list[PolicyConnection] = [connect_once()]

    def one_request(count: int, tag: str) -> float:
        payload = adapter.build_request([observation] * count, request_id=f"capacity-{tag}")
        started = clock()
        adapter.parse_response(connections[0].infer(payload), count)
        return clock() - started

    def merged_requests(count: int, tag: str) -> float:
        # a closed loop, one connection per requester (a connection carries one at a time)
        requesters = CLOSED_LOOP_BATCHES * count

        def ask(index: int) -> list[float]:
            answered = []
            for round_ in range(CLOSED_LOOP_ROUNDS):
                payload = adapter.build_request(
                    [observation], request_id=f"capacity-{tag}-{index}-{round_}"
                )
                adapter.parse_response(connections[index].infer(payload), 1)
                answered.append(clock())
            return answered

        with ThreadPoolExecutor(max_workers=requesters) as pool:
            return closed_loop_seconds_per_batch(list(pool.map(ask, range(requesters))), count)

    try:
        plan: list[tuple[int, int, Callable[[str], float]]] = [
            (1, 1, lambda tag: one_request(1, tag))
        ]
        per_request = max(1, connections[0].max_batch_size())
        if per_request > 1:
            plan.append((per_request, 1, lambda tag: one_request(per_request, tag)))
        elif merged_batch_size > 1:
            connections += [
                connect_once() for _ in range(CLOSED_LOOP_BATCHES * merged_batch_size - 1)
            ]
            plan.append(
                (
                    merged_batch_size,
                    merged_batch_size,
                    lambda tag: merged_requests(merged_batch_size, tag),
                )
            )
        probes = []
        for observations, requests, run in plan:
            for index in range(warmup):
                run(f"b{observations}-warmup{index}")
            seconds = [run(f"b{observations}-{index}") for index in range(timed)]
            mean = sum(seconds) / len(seconds)
            probes.append({"observations": observations, "requests": requests, "seconds": mean})
    finally:
        for connection in connections:
            connection.close()
    probes = [{**p, "seconds": round(p["seconds"], 4)} for p in probes]
    best = max(p["observations"] / max(p["seconds"], 1e-4) for p in probes)
    return {"max_batch_size": plan[-1][0], "probes": probes, "obs_per_s": round(best, 2)}


def warm_graphs(
    connect_once: Callable[[], PolicyConnection],
    adapter: PolicyAdapter,
    observation: Observation,
    batches: Sequence[int],
    captured: Callable[[], Sequence[int]] | None = None,
    *,
    rounds: int = GRAPH_ROUNDS,
    lead_s: float = GRAPH_LEAD_S,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Send each merged batch size of ``batches`` once, largest first, so that the server
    captures its CUDA graph before the run needs it (module doc). For a size ``k``: one
    request, then ``lead_s`` later ``k`` requests together, each on its own connection.

    ``captured()`` (the server's log: the batch sizes it has captured graphs for) decides
    what a next round sends again, up to ``rounds`` rounds; without it one round is sent.
    Returns ``{"batches": the sizes asked for, "sent": requests sent, "captured": the sizes
    captured (None without ``captured``), "seconds": its wall time}``. Raises whatever a
    failed request raises."""
    wanted = sorted({int(k) for k in batches if int(k) >= 1}, reverse=True)
    started = clock()
    connections = [connect_once() for _ in range(max(wanted, default=0) + 1)]
    sent = 0

    def ask(index: int, tag: str) -> None:
        payload = adapter.build_request([observation], request_id=f"graphs-{tag}-{index}")
        adapter.parse_response(connections[index].infer(payload), 1)

    try:
        missing = wanted
        for round_ in range(rounds if captured is not None else 1):
            for size in missing:
                with ThreadPoolExecutor(max_workers=size + 1) as pool:
                    alone = pool.submit(ask, 0, f"r{round_}-b{size}-lead")
                    time.sleep(lead_s)  # the lone request reaches the idle server first
                    tag = f"r{round_}-b{size}"
                    together = [pool.submit(ask, i, tag) for i in range(1, size + 1)]
                    for future in [alone, *together]:
                        future.result()
                sent += size + 1
            if captured is None:
                break
            have = set(captured())
            missing = [k for k in wanted if k not in have]
            if not missing:
                break
    finally:
        for connection in connections:
            connection.close()
    return {
        "batches": sorted(wanted),
        "sent": sent,
        "captured": sorted(set(captured())) if captured is not None else None,
        "seconds": round(clock() - started, 2),
    }


def closed_loop_seconds_per_batch(answered: list[list[float]], batch: int) -> float:
    """Seconds per batch of `batch` observations of a merging server in a closed loop, from the
    times each requester's answers came back (one list per requester). Each requester's cycle
    is timed from its first answer to its last, which leaves out the first round (started at
    an idle server); the server's rate is the sum of the requesters' rates."""
    obs_per_s = 0.0
    for index, times in enumerate(answered):
        if len(times) < 2 or times[-1] <= times[0]:
            raise ValueError(
                f"closed-loop requester {index} got answers at {times}: at least two, "
                "at different times, are needed to time the server"
            )
        obs_per_s += (len(times) - 1) / (times[-1] - times[0])
    return batch / obs_per_s


@dataclass(frozen=True)
class CapacityProbe:
    """What measuring a slot's server needs, as plain data (it crosses to the serve job as
    JSON): the policy family and its settings (``policy.<family>``, from which the adapter and
    the endpoint are built), the merge limit of one-observation requests, the camera size,
    whether requests carry privileged state, the client's timeout and its setting, the modules
    that register a family of the config's own (``policy.family_modules``) and the merged
    batch sizes whose CUDA graphs to capture first (``graph_batches``, :func:`warm_graphs`;
    empty: none). Called with the server's URL it returns the capacity entry, with
    ``"graph_warmup"`` (what :func:`warm_graphs` returned) where it warmed graphs; each of its
    requests gets one try within the probe's timeout (``FailurePolicy.probe_timeout``)."""

    family: str
    policy: Mapping[str, Any]
    merged_batch_size: int
    camera_size: int
    privileged_state: bool
    timeout_s: float  # rollout.failures.probe_timeout_s (request_timeout_s when shorter)
    timeout_setting: str  # the one of the two it is, named when a request times out
    family_modules: tuple[str, ...]  # policy.family_modules: where the family is
    graph_batches: tuple[int, ...] = ()  # Family.graph_batches: sizes to capture graphs of

    def __call__(
        self, url: str, captured: Callable[[], Sequence[int]] | None = None
    ) -> dict[str, Any]:
        """The capacity entry of the server at ``url``; ``captured()``: the batch sizes whose
        graphs its log says it captured (the serve job reads the serve log), or None."""
        adapter = self.adapter()
        observation = synthetic_observation(self.camera_size, self.privileged_state)

        def connect_once() -> PolicyConnection:
            return self.connect(url)

        warmed = None
        if self.graph_batches:
            warmed = warm_graphs(connect_once, adapter, observation, self.graph_batches, captured)
        entry = measure_capacity(
            connect_once,
            adapter,
            observation,
            self.merged_batch_size,
            warmup=0 if warmed else WARMUP_CALLS,  # the graph warm-up ran every size already
        )
        return entry | {"graph_warmup": warmed} if warmed else entry

    def adapter(self) -> PolicyAdapter:
        """The family's adapter (its package registered first, ``family_modules``)."""
        families.load_modules(list(self.family_modules))
        return make_adapter(self.family, dict(self.policy))

    def connect(self, url: str) -> PolicyConnection:
        """A connection to the family's endpoint at ``url``: one try a request, within the
        probe's timeout."""
        families.load_modules(list(self.family_modules))
        spec = policy_connection_spec(url, self.family, dict(self.policy))
        return connect(
            spec, timeout_s=self.timeout_s, max_retries=0, timeout_setting=self.timeout_setting
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "policy": dict(self.policy),
            "family_modules": list(self.family_modules),
            "graph_batches": list(self.graph_batches),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityProbe:
        """The probe from :meth:`to_dict`'s form; ``ValueError`` names what is wrong."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, Mapping) or set(data) != names:
            raise ValueError(f"a capacity probe needs exactly the fields {sorted(names)}: {data!r}")
        return cls(
            **{
                **data,
                "family_modules": tuple(data["family_modules"]),
                "graph_batches": tuple(int(k) for k in data["graph_batches"]),
            }
        )
