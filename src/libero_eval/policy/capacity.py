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
reference server's ``max_batch_size``), sent at once, each on its own connection
(``requests`` = ``observations``).

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

from libero_eval.policy.adapters import make_adapter
from libero_eval.policy.adapters.base import Observation, PolicyAdapter
from libero_eval.policy.connection import PolicyConnection, connect, policy_connection_spec

WARMUP_CALLS = 1
TIMED_CALLS = 2
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

    def one_request(count: int, tag: str) -> None:
        payload = adapter.build_request([observation] * count, request_id=f"capacity-{tag}")
        adapter.parse_response(connections[0].infer(payload), count)

    def merged_requests(count: int, tag: str) -> None:
        # one connection per concurrent request: a connection carries one at a time
        payloads = [
            adapter.build_request([observation], request_id=f"capacity-{tag}-{index}")
            for index in range(count)
        ]
        with ThreadPoolExecutor(max_workers=count) as pool:
            answers = list(pool.map(lambda c, p: c.infer(p), connections[:count], payloads))
        for answer in answers:
            adapter.parse_response(answer, 1)

    try:
        plan: list[tuple[int, int, Callable[[str], None]]] = [
            (1, 1, lambda tag: one_request(1, tag))
        ]
        per_request = max(1, connections[0].max_batch_size())
        if per_request > 1:
            plan.append((per_request, 1, lambda tag: one_request(per_request, tag)))
        elif merged_batch_size > 1:
            connections += [connect_once() for _ in range(merged_batch_size - 1)]
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
            seconds = []
            for index in range(timed):
                started = clock()
                run(f"b{observations}-{index}")
                seconds.append(clock() - started)
            mean = sum(seconds) / len(seconds)
            probes.append({"observations": observations, "requests": requests, "seconds": mean})
    finally:
        for connection in connections:
            connection.close()
    probes = [{**p, "seconds": round(p["seconds"], 4)} for p in probes]
    best = max(p["observations"] / max(p["seconds"], 1e-4) for p in probes)
    return {"max_batch_size": plan[-1][0], "probes": probes, "obs_per_s": round(best, 2)}


@dataclass(frozen=True)
class CapacityProbe:
    """What measuring a slot's server needs, as plain data (it crosses to the serve job as
    JSON): the policy family and its settings (``policy.<family>``, from which the adapter and
    the endpoint are built), the merge limit of one-observation requests, the camera size,
    whether requests carry privileged state, and the client's timeout. Called with the
    server's URL it returns the capacity entry."""

    family: str
    policy: Mapping[str, Any]
    merged_batch_size: int
    camera_size: int
    privileged_state: bool
    timeout_s: float

    def __call__(self, url: str) -> dict[str, Any]:
        adapter = make_adapter(self.family, dict(self.policy))
        spec = policy_connection_spec(url, self.family, dict(self.policy))
        return measure_capacity(
            lambda: connect(spec, timeout_s=self.timeout_s, max_retries=0),
            adapter,
            synthetic_observation(self.camera_size, self.privileged_state),
            self.merged_batch_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"policy": dict(self.policy)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityProbe:
        """The probe from :meth:`to_dict`'s form; ``ValueError`` names what is wrong."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, Mapping) or set(data) != names:
            raise ValueError(f"a capacity probe needs exactly the fields {sorted(names)}: {data!r}")
        return cls(**data)
