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

The requests are synthetic: grey camera frames of the run's size, a robot at rest, and (when
the run sends privileged state, for the reference server's scripted expert) a scene with
nothing to do. Their actions are discarded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from libero_eval.policy import families
from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.connection import PolicyConnection, connect, policy_connection_spec
from libero_eval.policy.families import make_adapter

WARMUP_CALLS = 1
TIMED_CALLS = 2
CLOSED_LOOP_BATCHES = 2  # a merging server's closed loop: batches' worth of requesters
CLOSED_LOOP_ROUNDS = 4  # requests each requester sends, one after another
PROBE_TASK = "capacity probe: hold still"


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
    whether requests carry privileged state, the client's timeout and its setting, and the
    modules that register a family of the config's own (``policy.family_modules``). Called
    with the server's URL it returns the capacity entry; each of its requests gets one try
    within the probe's timeout (``FailurePolicy.probe_timeout``)."""

    family: str
    policy: Mapping[str, Any]
    merged_batch_size: int
    camera_size: int
    privileged_state: bool
    timeout_s: float  # rollout.failures.probe_timeout_s (request_timeout_s when shorter)
    timeout_setting: str  # the one of the two it is, named when a request times out
    family_modules: tuple[str, ...]  # policy.family_modules: where the family is

    def __call__(self, url: str) -> dict[str, Any]:
        families.load_modules(list(self.family_modules))
        adapter = make_adapter(self.family, dict(self.policy))
        spec = policy_connection_spec(url, self.family, dict(self.policy))
        return measure_capacity(
            lambda: connect(
                spec, timeout_s=self.timeout_s, max_retries=0, timeout_setting=self.timeout_setting
            ),
            adapter,
            synthetic_observation(self.camera_size, self.privileged_state),
            self.merged_batch_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "policy": dict(self.policy),
            "family_modules": list(self.family_modules),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityProbe:
        """The probe from :meth:`to_dict`'s form; ``ValueError`` names what is wrong."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, Mapping) or set(data) != names:
            raise ValueError(f"a capacity probe needs exactly the fields {sorted(names)}: {data!r}")
        return cls(**{**data, "family_modules": tuple(data["family_modules"])})
