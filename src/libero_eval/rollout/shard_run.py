"""A shard run end to end (`run_shard`): which server it waits for (known, or found while its
envs start: `startup`), its progress bar, the runner's loop (`runner.ShardRunner`), then the
shard's Parquet and its dispatch log (`dispatch_log`) with the event-log lines of its end."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from libero_eval.eventlog import log_event
from libero_eval.failures import FailurePolicy
from libero_eval.plan import Episode
from libero_eval.policy.connection import ConnectionSpec, PolicyConnection
from libero_eval.rollout.auto import ShardChoices
from libero_eval.rollout.env_worker import EnvWorker
from libero_eval.rollout.runner import ShardRunner
from libero_eval.rollout.shard_settings import ShardSettings
from libero_eval.rollout.startup import ServerGate, Service, probe_server
from libero_eval.store import EpisodeStore, write_results


def run_shard(
    episodes: Sequence[Episode],
    settings: ShardSettings,
    store: EpisodeStore,
    server_url: str | None,
    output_path: Path | str,
    progress: bool = True,
    dispatch_log: Path | None = None,
    capacity: dict[str, Any] | None = None,
    env_workers: Callable[[int], EnvWorker] | None = None,
    connections: Callable[[ConnectionSpec, FailurePolicy], PolicyConnection] | None = None,
    wait_for_service: Callable[[], Service] | None = None,
    job_start: float | None = None,
) -> list[dict[str, Any]]:
    """Run a shard end to end: run what is missing, write the Parquet and, with
    `dispatch_log`, the shard's requests, env times, timeline and choices (JSON).

    The server is `server_url` with the serve job's `capacity` probe (checked before any env
    starts), or, with `wait_for_service`, whatever that returns once the service is ready
    (url, capacity): then the envs start at once and the wait runs beside them (`startup`).
    `env_workers`, `connections`: see `ShardRunner` (the server's check uses a plain
    connection); `job_start`: when the job's process began (default: now)."""
    job_start = time.time() if job_start is None else job_start
    finished = store.finished(episodes)  # one pass over the records, not one per episode
    pending = [ep for ep in episodes if ep not in finished]
    if wait_for_service is not None:
        gate = ServerGate(lambda: probe_server(settings, *wait_for_service()))
    elif pending:
        gate = ServerGate.known(probe_server(settings, server_url or "", capacity))
    else:
        gate = ServerGate()  # nothing to run: no server needed
    bar = None
    if progress and pending:
        from tqdm import tqdm

        bar = tqdm(total=len(episodes), initial=len(episodes) - len(pending), desc=settings.shard)

    def on_progress(done: int, total: int, successes: int) -> None:
        if bar is not None:
            bar.n = done
            bar.set_postfix(success=f"{successes}/{done - (len(episodes) - len(pending))}")
            bar.refresh()

    runner = ShardRunner(settings, store, gate, on_progress, env_workers, connections)
    log = runner.dispatch_log
    log.mark("job_start", job_start)
    try:
        records = runner.run(episodes)
    finally:
        if bar is not None:
            bar.close()
    write_results(records, output_path)
    log.mark("shard_end")
    if dispatch_log is not None:
        _write_dispatch_log(runner, Path(dispatch_log), len(episodes), len(pending))
    return records


def _write_dispatch_log(runner: ShardRunner, path: Path, episodes: int, ran: int) -> None:
    """The shard's dispatch log, and the event-log lines of its end."""
    s, log = runner.settings, runner.dispatch_log
    choices = runner.choices
    if choices is None:  # every episode was finished by an earlier run
        setting = s.envs_per_shard if s.total_num_envs is None else s.total_num_envs
        choices = ShardChoices(setting, s.merged_dispatch, 0, "no episode to run")
        choices.close(0, None)
    log.choices = choices.as_log()
    kept = choices.envs.value if choices.envs is not None else 0
    log.write(
        path,
        {
            "shard": s.shard,
            "slot": s.slot,
            "server_url": runner.url,
            "envs": kept,
            "envs_started": runner.envs_started,
            "max_batch_size": runner.max_batch_size,
            "server_batch": runner.server_batch,
            "max_inflight_requests": runner.max_inflight,
            "reused_episodes": episodes - ran,
            "episodes_run": ran,
        },
    )
    last, end = log.timeline["last_answer"], log.timeline["shard_end"]
    if last is not None and end is not None:
        source = f"rollout {s.shard}"
        log_event(s.event_log, source, f"last answer: {len(log.requests)} requests answered")
        log_event(s.event_log, source, f"shard end {end - last:.1f} s after its last answer")
