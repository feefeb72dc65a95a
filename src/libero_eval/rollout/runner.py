"""A rollout shard: E LIBERO env workers, batched policy calls, one record per episode.

The loop keeps the server busy with full batches: a worker that is waiting for actions holds a
ready observation; ready observations queue by prompt (the server rejects mixed prompts in a
batch) and leave in requests of up to the server's max batch size when
`dispatch.Dispatcher` says so, on a small pool of policy threads; while requests are in flight
the other workers keep stepping. Each finished episode is written to the episode store at
once, so a killed shard loses only the episodes in flight. Which episode a worker runs next
(packed onto tasks so that batches fill), and the shard's counts, are kept by
`scheduler.EpisodeScheduler`; this module runs the processes and the policy calls around them,
and writes the shard's dispatch log (every request, and the envs' time waiting and stepping),
from which the run reports its GPU efficiency.

Failures have one owner, `libero_eval.failures.FailurePolicy` (`rollout.failures`): every
failure arrives classified (the connection's errors carry their kind; an env worker's reply is
an env error or a dead process) and the policy says what follows: the connection retries a
transient failure itself; here an episode is retried on a restarted worker, recorded with its
error, or the shard fails with `ShardFailed` (a server gone after its retries, a rejected
request, too many bad answers in a row); finished episodes stay in the store for the rerun.
Failures injected on purpose (the tests' `LIBERO_EVAL_FAULT`) wrap the env workers and the store
the runner is given (composed in `shard_job`); its loop has no hook for them.
"""

from __future__ import annotations

import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from libero_eval.eventlog import episode_line, log_event
from libero_eval.failures import Action, FailureKind, FailurePolicy
from libero_eval.plan import Episode
from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.connection import (
    ConnectionSpec,
    PolicyConnection,
    connect,
)
from libero_eval.policy.errors import PolicyClientError
from libero_eval.rollout.dispatch import Dispatcher, LatencyModel
from libero_eval.rollout.dispatch_log import DispatchLog
from libero_eval.rollout.env_worker import (
    Command,
    EnvSettings,
    EnvWorker,
    EpisodeOutcome,
    EpisodeSpec,
    Status,
)
from libero_eval.rollout.protocols import EpisodeProtocol, reset_seed_of
from libero_eval.rollout.scheduler import EpisodeScheduler, RunningEpisode
from libero_eval.rollout.waiting import WaitingLog
from libero_eval.store import EpisodeStore, write_results
from libero_eval.suites import base_suite


class ShardFailed(RuntimeError):
    """The shard cannot go on (server gone, request rejected); finished episodes are kept."""


@dataclass
class ShardSettings:
    """What a shard runs with; composed above this layer (`libero_eval.config.RunSettings`).

    Its config fields (`rollout.envs_per_shard`, `max_inflight_requests`, `batch_timeout_s`,
    `server.health_timeout_s`) have no default here: the config, filled by the schema, gives
    them (tests/test_settings_defined_once.py checks them against the schema)."""

    run_id: str
    shard: str
    slot: int
    protocol: EpisodeProtocol  # its seed is the run's seed (recorded in every row)
    env: EnvSettings
    adapter: PolicyAdapter  # built once, by whoever composed the job (its statistics loaded)
    envs_per_shard: int  # what the job got (rollout.envs_per_shard, maybe lowered to --cores)
    # requests at the server at once (one computing, the rest queued behind it); None: as
    # many as the envs fill, ceil(envs / the server's max batch)
    max_inflight_requests: int | None
    merged_dispatch: str  # at a merging server: "batches" or "as_ready" (Dispatcher.as_ready)
    batch_timeout_s: float  # a partial batch waits no longer at an idle server
    health_timeout_s: float  # server.health_timeout_s
    # the server's endpoint (channel, wire format, paths); its URL comes from the service file
    endpoint: ConnectionSpec = field(default_factory=lambda: ConnectionSpec(""))
    # what a failure leads to (rollout.failures); None: the schema's defaults
    failures: FailurePolicy | None = None
    event_log: Path | None = None
    video_dir: Path | None = None


def _record(
    settings: ShardSettings,
    episode: Episode,
    running: RunningEpisode | None,
    url: str | None,
    outcome: EpisodeOutcome | None = None,
    error: str | None = None,
    video_path: str | None = None,
) -> dict[str, Any]:
    latencies = np.asarray(running.latencies if running else [], dtype=float)
    has_latency = latencies.size > 0
    protocol = settings.protocol.with_seed(episode.seed)  # the episode's run seed (plan.seeds)
    return {
        "run_id": settings.run_id,
        "suite": episode.suite,
        "base_suite": base_suite(episode.suite),
        "task_id": episode.task_id,
        "task_language": running.task_language if running else None,
        "init_state_id": episode.init_state_id,
        "seed": protocol.seed,
        "reset_seeding": settings.env.reset_seeding,
        "episode_seed": reset_seed_of(
            protocol,
            settings.env.reset_seeding,
            episode.suite,
            episode.task_id,
            episode.init_state_id,
        ),
        "protocol": settings.protocol.name,
        "success_once": bool(outcome and outcome.success_once),
        "success_at_end": bool(outcome and outcome.success_at_end),
        "first_success_step": outcome.first_success_step if outcome else None,
        "steps": outcome.steps if outcome else 0,
        "policy_calls": int(latencies.size),
        "policy_latency_mean_s": float(latencies.mean()) if has_latency else None,
        "policy_latency_p50_s": float(np.percentile(latencies, 50)) if has_latency else None,
        "policy_latency_p95_s": float(np.percentile(latencies, 95)) if has_latency else None,
        "wall_time_s": time.perf_counter() - running.started if running else 0.0,
        "server_slot": settings.slot,
        "server_url": url,
        "shard": settings.shard,
        "finished_at": time.time(),
        "video_path": video_path,
        "error": error,
    }


def _save_video(frames: list[np.ndarray], video_dir: Path, episode: Episode, success: bool) -> str:
    """Write an episode video under a unique name (never overwritten: suite/task/trial)."""
    import imageio.v3 as iio

    tag = "success" if success else "failure"
    path = (
        video_dir
        / episode.suite
        / f"task{episode.task_id:02d}_init{episode.init_state_id:02d}_{tag}.mp4"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, np.stack(frames), fps=10, codec="libx264")
    return str(path)


class _Answer(NamedTuple):
    """A policy call's outcome: `Status.OK` with the actions, or `Status.ERROR` with the
    exception; its wall time, when it came back and when it began to leave (monotonic)."""

    status: Status
    value: Any
    latency_s: float
    answered_at: float
    left_at: float


class _CallPool:
    """A few daemon threads running policy calls.

    Daemon threads, unlike ThreadPoolExecutor's, never hold up the exit of a failing shard
    while a request to a dead server waits for its timeout.
    """

    def __init__(self, size: int, call: Callable[[Any], None]):
        self._tasks: queue.Queue = queue.Queue()
        self._call = call
        self._threads = [
            threading.Thread(target=self._work, name=f"policy-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            self._call(task)

    def submit(self, task: Any) -> None:
        self._tasks.put(task)

    def close(self, wait: bool) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class ShardRunner:
    """Runs one shard's episodes against one policy server."""

    def __init__(
        self,
        settings: ShardSettings,
        store: EpisodeStore,
        server_url: str,
        progress: Callable[[int, int, int], None] | None = None,
        max_batch_size: int = 1,
        latency: LatencyModel | None = None,
        server_batch: int = 1,
        env_workers: Callable[[int], EnvWorker] | None = None,
        connections: Callable[[ConnectionSpec, FailurePolicy], PolicyConnection] | None = None,
    ):
        """`max_batch_size`: observations one request may carry; `server_batch`: the batch
        the server computes, larger where it merges concurrent requests itself (π0.5 on
        SGLang); `latency`: its latency model, measured at its start (None: learned from the
        first answer); `env_workers`: builds env worker `i` (None: a plain `EnvWorker`);
        `connections`: opens a policy thread's connection (None: `connect`); `shard_job`
        wraps both to inject failures."""
        self.settings = settings
        self.latency = latency
        self.dispatch_log = DispatchLog()
        self.failures = settings.failures or FailurePolicy.defaults()
        self.env_workers = env_workers or (
            lambda index: EnvWorker(index, settings.env, settings.protocol)
        )
        self.connections = connections or connect
        self.max_batch_size = max(1, max_batch_size)
        self.server_batch = max(self.max_batch_size, server_batch)
        self.store = store
        self.url = server_url
        self.adapter = settings.adapter
        self.progress = progress
        self._spec: ConnectionSpec = settings.endpoint.at(server_url)
        self._local = threading.local()
        self._connections: list[PolicyConnection] = []
        self._connections_lock = threading.Lock()
        self._done_queue: queue.Queue = queue.Queue()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)

    # -- policy calls (on policy threads) --------------------------------------------------------
    def _connection(self) -> PolicyConnection:
        """This thread's connection to the server (one request at a time each)."""
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self.connections(self._spec, self.failures)
            self._local.connection = connection
            with self._connections_lock:
                self._connections.append(connection)
        return connection

    def _call_policy(self, task: tuple[int, list[tuple[int, Observation]], Any]) -> None:
        request, batch, prebuilt = task
        observations = [obs for _, obs in batch]
        started = left = time.monotonic()
        try:
            payload = prebuilt if prebuilt is not None else self._build(observations)
            if isinstance(payload, Exception):
                raise payload
            left = time.monotonic()
            response = self._connection().infer(payload)
            actions = self.adapter.parse_response(response, len(observations))
            status, value = Status.OK, actions
        except Exception as exc:  # noqa: BLE001 - handed to the main loop to decide
            status, value = Status.ERROR, exc
        now = time.monotonic()
        self._done_queue.put((request, batch, _Answer(status, value, now - started, now, left)))
        self._wake_writer.send(b"x")

    # -- main loop -----------------------------------------------------------------------------
    def run(self, episodes: Sequence[Episode]) -> list[dict[str, Any]]:
        """Run the episodes not yet in the store; return all records in plan order."""
        s = self.settings
        finished = self.store.finished(episodes)
        pending = [ep for ep in episodes if ep not in finished]
        log_event(
            s.event_log,
            f"rollout {s.shard}",
            f"rank {s.shard} -> {self.url} ({len(pending)} to run, {len(finished)} already "
            f"finished, {min(s.envs_per_shard, len(pending))} envs)",
        )
        if pending:
            self._run_pending(pending, done_before=len(finished), total=len(episodes))
        records = []
        for episode in episodes:
            record = self.store.load(episode)
            if record is None:
                raise ShardFailed(f"{s.shard}: episode {episode.key} has no record after the run")
            records.append(record)
        return records

    def _run_pending(self, pending: list[Episode], done_before: int, total: int) -> None:
        s = self.settings
        workers = [self.env_workers(i) for i in range(min(s.envs_per_shard, len(pending)))]
        # A server that merges requests itself (SGLang's dynamic batching) merges any prompts
        # (an action request's prompt is not in its batch signature: sglang/multimodal_gen/
        # configs/sample/action.py): one queue (and rollout.merged_dispatch says how it leaves).
        self._merged = self.server_batch > self.max_batch_size
        # the state of this run, shared by the loop's steps below
        self._workers = workers
        self._scheduler = EpisodeScheduler(
            pending,
            1 if self._merged else self.max_batch_size,
            done_before,
            total,
            self.failures,
            self.progress,
        )
        self.max_inflight = s.max_inflight_requests or -(-len(workers) // self.server_batch)
        as_ready = self._merged and s.merged_dispatch == "as_ready"
        self._dispatcher = Dispatcher(
            self.server_batch, self.max_inflight, s.batch_timeout_s, self.latency, as_ready
        )
        self._ready: dict[int, Observation] = {}  # workers' observations waiting for actions
        self._prebuilt: dict[int, Any] = {}  # merged: each ready observation's request
        self._sent_at: dict[int, float] = {}  # batch id -> when it left (monotonic)
        self._parts: dict[int, int] = {}  # batch id -> its requests not yet answered
        self._prompt_of_task: dict[tuple[str, int], Any] = {}  # seen prompts, for siblings
        self._bad_in_a_row = 0  # consecutive unusable policy answers
        waiting = WaitingLog(self.failures, self.url, s.shard, s.event_log)
        parts = -(-self.server_batch // self.max_batch_size)
        pool = _CallPool(max(1, self.max_inflight * parts), self._call_policy)
        fatal: BaseException | None = None
        try:
            for worker in workers:
                self._start(worker, self._scheduler.next_for(worker.index))
            while not self._scheduler.all_done:
                conns = [w.conn for w in workers if w.busy]
                wake = self._dispatcher.next_decision(time.monotonic())
                timeout = 1.0 if wake is None else min(1.0, wake)
                for ready in wait([*conns, self._wake_reader], timeout=timeout):
                    if ready is not self._wake_reader:
                        self._on_env_message(next(w for w in workers if w.conn is ready))
                self._on_policy_answers()
                self._send_due(pool)
                waiting.check(self._sent_at, time.monotonic())
        except BaseException as exc:
            fatal = exc
            raise
        finally:
            pool.close(wait=fatal is None)
            for worker in workers:
                if fatal is None:
                    worker.stop()
                else:  # a failing shard loses its in-flight episodes anyway: don't wait
                    worker.kill()
            if fatal is None:
                for connection in self._connections:
                    connection.close()

    def _start(self, worker: EnvWorker, episode: Episode) -> None:
        self._send_start(worker, self._scheduler.start(worker.index, episode))

    def _send_start(self, worker: EnvWorker, running: RunningEpisode) -> None:
        """Send `worker` the episode it now runs."""
        episode = running.episode
        spec = EpisodeSpec(episode.suite, episode.task_id, episode.init_state_id, seed=episode.seed)
        worker.send(Command.START, spec)
        self.dispatch_log.env(worker.index, "stepping", time.monotonic())

    def _finish(self, worker: EnvWorker, record: dict[str, Any]) -> None:
        """Store and log `worker`'s finished episode, then start its next one."""
        s = self.settings
        episode = self._scheduler.running_on(worker.index).episode
        self.store.write(episode, record)
        line = episode_line(
            episode.task_id,
            episode.init_state_id,
            record["success_once"],
            episode.suite,
            record["steps"],
        )
        if record["error"]:
            line += f", error={record['error'].splitlines()[0]}"
        log_event(s.event_log, f"rollout {s.shard}", line)
        self.dispatch_log.env(worker.index, None, time.monotonic())
        following = self._scheduler.finish(worker.index, record["success_once"])
        if following is not None:
            self._start(worker, following)

    def _fail(self, worker: EnvWorker, message: str) -> None:
        info = self._scheduler.running_on(worker.index)
        self._finish(worker, _record(self.settings, info.episode, info, self.url, error=message))

    def _on_env_message(self, worker: EnvWorker) -> None:
        """An env worker answered: its env died or raised, its episode ended, or it is ready."""
        s = self.settings
        status, result = worker.receive()
        info = self._scheduler.running_on(worker.index)
        if status == Status.DIED:
            worker.restart()
            retry = self._scheduler.retry(worker.index)  # as the failure policy says
            if retry is None:
                self._fail(worker, result)
            else:
                print(f"[{s.shard}] {result}; retrying {info.episode.key}", file=sys.stderr)
                self._send_start(worker, retry)
        elif status == Status.ERROR:  # FailureKind.ENV_ERROR: recorded on its episode
            self._fail(worker, result)
        elif isinstance(result, EpisodeOutcome):
            video = None
            if s.video_dir is not None and result.frames:
                video = _save_video(result.frames, s.video_dir, info.episode, result.success_once)
            self._finish(worker, _record(s, info.episode, info, self.url, result, video_path=video))
        else:
            info.task_language = result.task_language
            now = time.monotonic()
            key = "" if self._merged else self.adapter.prompt_key(result)
            self._prompt_of_task[(info.episode.suite, info.episode.task_id)] = key
            self._ready[worker.index] = result
            if self._merged:
                self._prebuilt[worker.index] = self._build([result])
            self._dispatcher.ready(worker.index, key, now)
            self.dispatch_log.env(worker.index, "waiting", now)

    def _on_policy_answers(self) -> None:
        """Hand the finished policy calls' action chunks to their workers."""
        try:
            while True:
                self._wake_reader.recv(4096)
        except BlockingIOError:
            pass
        while True:
            try:
                request, batch, (status, value, latency, answered_at, left_at) = (
                    self._done_queue.get_nowait()
                )
            except queue.Empty:
                return
            ok, sent_at = status == Status.OK, self._sent_at[request]
            self.dispatch_log.request(sent_at, answered_at, len(batch), ok, request, left_at)
            self._parts[request] -= 1
            if not self._parts[request]:  # the whole batch is back
                del self._parts[request], self._sent_at[request]
                self._dispatcher.answered(request, answered_at)
            if ok:
                self._bad_in_a_row = 0
            else:
                self._on_policy_failure(value)
            for position, (index, _obs) in enumerate(batch):
                worker = self._workers[index]
                self._scheduler.running_on(index).latencies.append(latency)
                if status == Status.ERROR:
                    kind = (
                        "bad policy response"
                        if getattr(value, "kind", None) is FailureKind.BAD_ANSWER
                        else type(value).__name__
                    )
                    self._fail(worker, f"{kind}: {value}")
                else:
                    worker.send(Command.CHUNK, value[position])
                    self.dispatch_log.env(index, "stepping", time.monotonic())

    def _on_policy_failure(self, error: BaseException) -> None:
        """A failed policy call, classified by its connection (or the adapter): fail the
        shard where the failure policy says so; else its episodes record the error. An error
        of no kind (the adapter could not build the request) is its episodes' only."""
        s = self.settings
        kind = error.kind if isinstance(error, PolicyClientError) else None
        if kind is None:
            return
        self._bad_in_a_row += kind is FailureKind.BAD_ANSWER
        gave_up = kind is FailureKind.TRANSIENT  # its connection asked the policy every try
        if not gave_up and self.failures.decide(kind, self._bad_in_a_row) is not Action.FAIL_SHARD:
            return
        if kind is FailureKind.BAD_ANSWER:
            raise ShardFailed(
                f"{s.shard}: policy server {self.url} gave {self._bad_in_a_row} "
                f"unusable answers in a row, last: {error}. Check that the "
                "URL points at a policy server of the configured family "
                "(policy.family) and read its log (rollout.failures.bad_answers_in_a_row)"
            ) from error
        raise ShardFailed(f"{s.shard}: policy server {self.url} failed: {error}") from error

    def _send_due(self, pool: _CallPool) -> None:
        """Send the requests the dispatcher says are due (see `dispatch.Dispatcher`)."""
        coming: dict[Any, int] = {}  # per prompt: running envs whose observation will come
        for worker in self._workers:
            if worker.index not in self._ready and self._scheduler.is_running(worker.index):
                episode = self._scheduler.running_on(worker.index).episode
                key = self._prompt_of_task.get((episode.suite, episode.task_id))
                if key is not None:
                    coming[key] = coming.get(key, 0) + 1
        now = time.monotonic()
        for request, indices in self._dispatcher.due(now, coming):
            batch = [(index, self._ready.pop(index)) for index in indices]
            parts = [
                batch[i : i + self.max_batch_size]
                for i in range(0, len(batch), self.max_batch_size)
            ]
            self._sent_at[request], self._parts[request] = now, len(parts)
            for part in parts:
                prebuilt = self._prebuilt.pop(part[0][0], None) if self._merged else None
                pool.submit((request, part, prebuilt))

    def _build(self, observations: list[Observation]) -> Any:
        """The request of `observations`, or the exception building it raised (raised again
        by its policy call). A merged request is built as its observation comes: a batch's
        requests built at sending, one after another under the GIL, reach a merging server
        spread out (docs/performance.md, "Split batches")."""
        try:
            return self.adapter.build_request(observations, request_id=uuid.uuid4().hex)
        except Exception as exc:  # noqa: BLE001 - the episode's error, at its policy call
            return exc


def run_shard(
    episodes: Sequence[Episode],
    settings: ShardSettings,
    store: EpisodeStore,
    server_url: str,
    output_path: Path | str,
    progress: bool = True,
    dispatch_log: Path | None = None,
    capacity: dict[str, Any] | None = None,
    env_workers: Callable[[int], EnvWorker] | None = None,
    connections: Callable[[ConnectionSpec, FailurePolicy], PolicyConnection] | None = None,
) -> list[dict[str, Any]]:
    """Run a shard end to end: wait for the server, run what is missing, write the Parquet
    and, with `dispatch_log`, the shard's requests and env times (JSON). `capacity`: the
    server's capacity probe from its service file, the dispatcher's first latency model;
    `env_workers`, `connections`: see `ShardRunner` (the probe uses a plain connection)."""
    finished = store.finished(episodes)  # one pass over the records, not one per episode
    pending = [ep for ep in episodes if ep not in finished]
    max_batch = 1
    adapter = settings.adapter
    if pending:
        failures = settings.failures or FailurePolicy.defaults()
        seconds, named = failures.probe_timeout()  # a first look, named as such on timeout
        probe = connect(
            settings.endpoint.at(server_url), failures, timeout_s=seconds, timeout_setting=named
        )
        try:
            probe.wait_until_healthy(settings.health_timeout_s)
            adapter.check_server_metadata(probe.metadata())
            max_batch = probe.max_batch_size()
        except PolicyClientError as exc:
            raise ShardFailed(
                f"{settings.shard}: policy server {server_url} is not usable: {exc}"
            ) from exc
        finally:
            probe.close()
    bar = None
    if progress and pending:
        from tqdm import tqdm

        bar = tqdm(total=len(episodes), initial=len(episodes) - len(pending), desc=settings.shard)

    def on_progress(done: int, total: int, successes: int) -> None:
        if bar is not None:
            bar.n = done
            bar.set_postfix(success=f"{successes}/{done - (len(episodes) - len(pending))}")
            bar.refresh()

    runner = ShardRunner(
        settings,
        store,
        server_url,
        progress=on_progress,
        max_batch_size=max_batch,
        latency=LatencyModel.from_capacity(capacity),
        # the batch the server computes: larger than a request's where it merges requests
        server_batch=int((capacity or {}).get("max_batch_size", max_batch)),
        env_workers=env_workers,
        connections=connections,
    )
    try:
        records = runner.run(episodes)
    finally:
        if bar is not None:
            bar.close()
    write_results(records, output_path)
    if dispatch_log is not None:
        runner.dispatch_log.write(
            Path(dispatch_log),
            {
                "shard": settings.shard,
                "slot": settings.slot,
                "server_url": server_url,
                "envs": min(settings.envs_per_shard, len(pending)),
                "max_batch_size": max_batch,
                "server_batch": runner.server_batch,
                "max_inflight_requests": getattr(runner, "max_inflight", 0),
                "reused_episodes": len(episodes) - len(pending),
                "episodes_run": len(pending),
            },
        )
    return records
