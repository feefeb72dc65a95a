"""A shard's dispatch log (`results/<run>/shards/<shard>.dispatch.json`): every policy request
(sent, answered, observations, ok, its batch, when it began to leave) and the envs' time
waiting and stepping, read by `libero_eval.efficiency` for the run's GPU efficiency report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


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
        self._env_state: dict[int, tuple[str, float]] = {}

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

    def write(self, path: Path, header: dict[str, Any]) -> None:
        """Close every env's clock and write the log as JSON (atomically)."""
        now = time.monotonic()
        for worker in list(self._env_state):
            self.env(worker, None, now)
        data = {
            **header,
            "started_at": self.started_at,
            "ended_at": time.time(),
            "requests": [list(r) for r in self.requests],
            "env_seconds": self.env_seconds,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".part")
        partial.write_text(json.dumps(data))
        partial.replace(path)
