"""A shard's dispatch log (`results/<run>/shards/<shard>.dispatch.json`): every policy request
(sent, answered, observations, ok, its batch, when it began to leave), the envs' time waiting
and stepping, what each observation took in its env worker (`ENV_WORK`), the shard's
timeline (`TIMELINE`), its server's start as the service file gave it at ready (`"server"`)
and its choices of envs and dispatch (with
why), read by `libero_eval.analysis.efficiency` for the run's GPU efficiency report and its
timeline."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

# The shard's milestones, wall clock (time.time()); None when it did not happen (a shard whose
# episodes were all reused has only job_start and shard_end). docs: the timeline contract.
TIMELINE = (
    "job_start",  # the rollout job's process began (before making env workers)
    "envs_started",  # every env worker process had been spawned
    "envs_ready",  # the last of the shard's envs had its first observation
    "service_ready",  # the shard saw its slot's service file ready (and /health 200)
    "first_request",  # its first policy request left (column 0 of the first request)
    "last_answer",  # its last policy answer came back (the latest column 1)
    "shard_end",  # every env worker closed and the outputs written
)


# One entry per observation an env worker sent back (docs/reporting.md, "Where the wall time
# went").
ENV_WORK = (
    "received_at",  # when the shard received it (wall clock)
    "command",  # "start" (an episode's first observation) or "chunk" (after an action chunk)
    "shard_s",  # a chunk's: from its sending to the observation's receipt, as the shard saw it
    "wall_s",  # the command's wall seconds in the worker (physics, control, rendering)
    "cpu_s",  # the worker process's CPU seconds in it
    "render_s",  # the seconds its cameras rendered in it (None where they render every step)
)


class DispatchLog:
    """What the shard's requests and envs did, for the run's efficiency report.

    Times are wall-clock (time.time()) so that the shards of one slot can be merged. Envs
    are "stepping" from a start or a chunk until their next observation or outcome, and
    "waiting" while their observation is queued or in flight.
    """

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()
        self.started_at = time.time()
        self.requests: list[tuple[float, float, int, bool, int, float]] = []
        self.env_seconds = {"waiting": 0.0, "stepping": 0.0}
        self.env_work: list[tuple] = []  # ENV_WORK per observation
        self._env_state: dict[int, tuple[str, float]] = {}
        self.timeline: dict[str, float | None] = dict.fromkeys(TIMELINE)
        self.choices: dict[str, dict[str, Any]] = {}  # envs_choice, dispatch_choice
        self.server: dict[str, Any] | None = None  # the service file at ready (SERVER_RECORD)

    def mark(self, milestone: str, at: float | None = None) -> bool:
        """Record `milestone` (one of TIMELINE) at wall time `at` (default: now), once;
        True the first time."""
        if self.timeline[milestone] is not None:
            return False
        self.timeline[milestone] = time.time() if at is None else at
        return True

    def wall(self, monotonic: float) -> float:
        """A monotonic time as wall-clock time."""
        return monotonic + self._offset

    def request(
        self,
        sent_at: float,
        answered_at: float,
        observations: int,
        ok: bool,
        batch: int,
        left_at: float,
    ) -> None:
        """One request (monotonic times) of server batch `batch` (several requests where the
        server merges them): sent (the batch's dispatch), answered, and when its bytes began
        to leave (once built)."""
        self.requests.append(
            (
                sent_at + self._offset,
                answered_at + self._offset,
                observations,
                ok,
                batch,
                left_at + self._offset,
            )
        )

    def env(self, worker: int, state: str | None, now: float) -> None:
        """`worker` is now "stepping", "waiting" or idle (None), since `now` (monotonic)."""
        previous = self._env_state.pop(worker, None)
        if previous is not None:
            self.env_seconds[previous[0]] += now - previous[1]
        if state is not None:
            self._env_state[worker] = (state, now)

    def work(self, received_at: float, shard_s: float | None, work: Any) -> None:
        """An env's observation received at `received_at` (monotonic), after a chunk the
        shard had sent `shard_s` seconds before (None: an episode's start), and what it took
        in the worker (`env_worker.WorkTime`; nothing is logged without one)."""
        if work is None:
            return
        command = "start" if shard_s is None else "chunk"
        self.env_work.append((received_at + self._offset, command, shard_s, *work))

    def write(self, path: Path, header: dict[str, Any]) -> None:
        """Close every env's clock and write the log as JSON (atomically)."""
        now = time.monotonic()
        for worker in list(self._env_state):
            self.env(worker, None, now)
        if self.requests:
            self.timeline["last_answer"] = max(r[1] for r in self.requests)
        data = {
            **header,
            "started_at": self.started_at,
            "ended_at": time.time(),
            "requests": [list(r) for r in self.requests],
            "env_seconds": self.env_seconds,
            "env_work": [list(w) for w in self.env_work],
            "timeline": self.timeline,
            "server": self.server,
            **self.choices,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".part")
        partial.write_text(json.dumps(data))
        partial.replace(path)
