"""A shard's start: its env workers come up while its server loads.

A GPU server takes 75-117 s to load and warm up (issue 39, one H200), the shard's envs 16-49 s
to start and reset. So a shard starts its env workers and brings each to its first observation
at once, and what it must know of its server before the first request (the service file
"ready", `/health`, the metadata check, the request's max batch size, the capacity probe) is
found meanwhile on a thread of its own (`ServerGate`). The shard's loop looks at the gate
between env messages; its first request leaves when both are done.

What the start minds:
- A failure of either side ends the shard at once, with the other side stopped: env workers
  that cannot be started (the workers already started are killed, `workers.WorkerSet`), a
  server that failed or timed out (the gate raises it in the loop, which kills the env
  workers; finished episodes are in the store). In the Snakemake group job (the service and
  its consumers start together, docs/rfcs/0002) a failing consumer fails the group, and
  Snakemake tears the server down (NOTES.md §4); a consumer that ends well is followed by the
  server's SIGTERM once every consumer has ended.
- SIGTERM during the wait reaches the loop (the main thread), which kills the env workers.
- A shard whose episodes are all finished starts neither envs nor the wait: it needs no server.
- The cores: the env workers run at `rollout.env_niceness` (10), so the server's start (its
  imports, weights and warm-up on the CPU side) wins the cores they share.
- The GPU: env workers rendering on the server's GPU create their EGL contexts (552 MiB
  each, docs/performance.md "Memory and time per env on the GPU") while the server starts.
  SGLang 0.5.23 reads the GPU's free memory once at its start to choose where its weights
  live (`runtime/server_args/auto_tune.py`, `_get_min_available_device_memory_gb`): a model
  whose pipeline config sets `keep_resident_min_available_gb` keeps its weights resident only
  with that much free (120 GiB at the most among the built-in families; each family package
  cites its own), one that sets none keeps them whatever is free. Renderers starting first
  leave it less: 16 envs (8.6 GiB) leave 131 GiB of an H200's 140, about 38 would cross the
  120 GiB line (that server then offloads: its log says
  "Auto memory policy ... selects layerwise offload" instead of "Disabling component
  offload ... because minimum available memory ... is"). With
  `rollout.total_num_envs: auto` the envs a shard starts stay within its render budget
  (`ShardSettings.render_gpu_budget_mib`: 14% of the GPU, 36 envs on an H200, or what
  `server.sglang.gpu_memory_cap_gib` leaves, or what a family whose weights stay resident
  says its server takes, `Family.sglang_server_gib`; `auto.start_count`); a fixed count is the
  user's, and `server.sglang.performance_mode: speed` keeps the weights resident whatever
  is free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from libero_eval.failures import FailurePolicy
from libero_eval.policy.connection import connect
from libero_eval.policy.errors import PolicyClientError
from libero_eval.rollout.shard_settings import ShardFailed, ShardSettings

# the service file's content once "ready": its URL and the serve job's capacity probe, and
# optionally the server's start as the file gives it (`SERVER_RECORD`), kept in the dispatch log
Service = tuple[str, dict[str, Any] | None] | tuple[str, dict[str, Any] | None, dict[str, Any]]
# What the dispatch log keeps of the service file at ready ("server"): the aggregate step
# reads it where Snakemake has removed the service file (its service outputs go when their
# group job ends, which can be before the serve job's last write).
SERVER_RECORD = ("capacity", "timeline", "startup_parts")


@dataclass(frozen=True)
class ServerInfo:
    """What a shard knows of its server before its first request."""

    url: str
    max_batch: int  # observations one request may carry (its metadata)
    capacity: dict[str, Any] | None  # the serve job's probe at the server's start
    ready_at: float  # wall clock: when the shard saw the service ready
    record: dict[str, Any] | None = None  # the service file's SERVER_RECORD at ready

    @property
    def server_batch(self) -> int:
        """The batch the server computes: larger than a request's where it merges requests
        itself (SGLang's dynamic batching: its --batching-max-size, from the probe)."""
        return max(self.max_batch, int((self.capacity or {}).get("max_batch_size", 1)))


def probe_server(
    settings: ShardSettings,
    url: str,
    capacity: dict[str, Any] | None,
    record: dict[str, Any] | None = None,
) -> ServerInfo:
    """Check the server at `url` as the shard needs it: healthy, of the configured family
    (its metadata), and the observations a request may carry. Raises `ShardFailed`."""
    ready_at = time.time()
    failures = settings.failures or FailurePolicy.defaults()
    seconds, named = failures.probe_timeout()  # a first look, named as such on timeout
    probe = connect(settings.endpoint.at(url), failures, timeout_s=seconds, timeout_setting=named)
    try:
        probe.wait_until_healthy(settings.health_timeout_s)
        settings.adapter.check_server_metadata(probe.metadata())
        max_batch = max(1, probe.max_batch_size())
    except PolicyClientError as exc:
        raise ShardFailed(f"{settings.shard}: policy server {url} is not usable: {exc}") from exc
    finally:
        probe.close()
    return ServerInfo(url, max_batch, capacity, ready_at, record)


class ServerGate:
    """The server as the shard learns it: found on a thread while the envs start (`start`),
    or known from the beginning (`known`). `result` is None until then, and raises what
    finding it raised."""

    def __init__(self, find: Callable[[], ServerInfo] | None = None):
        self._find = find
        self._info: ServerInfo | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()

    @classmethod
    def known(cls, info: ServerInfo) -> ServerGate:
        gate = cls()
        gate._info = info
        gate._done.set()
        return gate

    def start(self, wake: Callable[[], None]) -> None:
        """Find the server on a daemon thread (a shard that fails or is stopped meanwhile
        does not wait for it); `wake()` when done."""
        if self._done.is_set():
            return

        def run() -> None:
            assert self._find is not None
            try:
                self._info = self._find()
            except BaseException as exc:  # noqa: BLE001 - raised again in the shard's loop
                self._error = exc
            self._done.set()
            wake()

        threading.Thread(target=run, name="server-wait", daemon=True).start()

    def result(self) -> ServerInfo | None:
        if not self._done.is_set():
            return None
        if self._error is not None:
            raise self._error
        return self._info
