"""A rollout shard: E LIBERO env workers, batched policy calls, one record per episode.

The loop keeps the server busy with full batches: a worker that is waiting for actions holds a
ready observation; ready observations queue by prompt (the server rejects mixed prompts in a
batch) and leave in requests of up to the server's max batch size when
`dispatch.Dispatcher` says so, on a small pool of policy threads; while requests are in flight
the other workers keep stepping. Each finished episode is written to the episode store at
once, so a killed shard loses only the episodes in flight. Which episode a worker runs next
(packed onto tasks so that batches fill), and the shard's counts, are kept by
`scheduler.EpisodeScheduler`; this module runs the processes and the policy calls around them
(`workers.WorkerSet`, `policy_calls.PolicyCalls`), and keeps the shard's dispatch log (every
request, the envs' time waiting and stepping, its timeline and choices), from which the run
reports its GPU efficiency; `shard_run` runs a shard end to end around it.

The envs start while the server does (`startup`): they come to their first observation while
the shard waits for its server on a thread; the first request leaves once both are done. A
worker with no episode left closes at once; the rest close together at the end. With
`rollout.total_num_envs: auto` or `rollout.merged_dispatch: auto` the shard measures its envs'
step time against the server's batch time and chooses (`auto`).

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

import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any

from libero_eval.eventlog import episode_line, log_event
from libero_eval.failures import Action, FailureKind, FailurePolicy
from libero_eval.plan import Episode
from libero_eval.policy.adapter import Observation
from libero_eval.policy.connection import ConnectionSpec, PolicyConnection, connect
from libero_eval.policy.errors import PolicyClientError
from libero_eval.rollout.auto import ShardChoices, start_count
from libero_eval.rollout.dispatch import Dispatcher, LatencyModel
from libero_eval.rollout.dispatch_log import DispatchLog
from libero_eval.rollout.env_worker import Command, EnvWorker, Status
from libero_eval.rollout.libero_env import EpisodeOutcome, EpisodeSpec
from libero_eval.rollout.policy_calls import PolicyCalls
from libero_eval.rollout.records import episode_record, save_video
from libero_eval.rollout.scheduler import EpisodeScheduler, RunningEpisode
from libero_eval.rollout.shard_settings import ShardFailed, ShardSettings
from libero_eval.rollout.startup import ServerGate, ServerInfo
from libero_eval.rollout.waiting import WaitingLog
from libero_eval.rollout.workers import WorkerSet
from libero_eval.store import EpisodeStore


class ShardRunner:
    """Runs one shard's episodes against one policy server."""

    def __init__(
        self,
        settings: ShardSettings,
        store: EpisodeStore,
        server: ServerGate,
        progress: Callable[[int, int, int], None] | None = None,
        env_workers: Callable[[int], EnvWorker] | None = None,
        connections: Callable[[ConnectionSpec, FailurePolicy], PolicyConnection] | None = None,
    ):
        """`server`: the server, known or found while the envs start (`startup`);
        `env_workers`: builds env worker `i` (None: a plain `EnvWorker`); `connections`:
        opens a policy thread's connection (None: `connect`); `shard_job` wraps both to
        inject failures."""
        self.settings = settings
        self.server = server
        self.dispatch_log = DispatchLog()
        self.failures = settings.failures or FailurePolicy.defaults()
        self.env_workers = env_workers or (
            lambda index: EnvWorker(index, settings.env, settings.protocol)
        )
        self.store = store
        self.adapter = settings.adapter
        self.progress = progress
        self.calls = PolicyCalls(self.adapter, connections or connect, self.failures)
        # what the server says (`_on_server`): until then no request leaves
        self.url: str | None = None
        self.max_batch_size = 1  # observations one request may carry
        self.server_batch = 1  # the batch the server computes (more where it merges)
        self.max_inflight = 0
        self.envs_started = 0
        self.choices: ShardChoices | None = None

    # -- main loop -----------------------------------------------------------------------------
    def run(self, episodes: Sequence[Episode]) -> list[dict[str, Any]]:
        """Run the episodes not yet in the store; return all records in plan order."""
        s = self.settings
        finished = self.store.finished(episodes)
        pending = [ep for ep in episodes if ep not in finished]
        if pending:
            self._run_pending(pending, done_before=len(finished), total=len(episodes))
        else:
            log_event(
                s.event_log,
                f"rollout {s.shard}",
                f"rank {s.shard}: 0 to run, {len(finished)} already finished (no server needed)",
            )
        records = []
        for episode in episodes:
            record = self.store.load(episode)
            if record is None:
                raise ShardFailed(f"{s.shard}: episode {episode.key} has no record after the run")
            records.append(record)
        return records

    def _run_pending(self, pending: list[Episode], done_before: int, total: int) -> None:
        s = self.settings
        count, bound = start_count(
            s.envs_per_shard, len(pending), s.total_num_envs == "auto", s.render_gpu_budget_mib
        )
        log_event(
            s.event_log,
            f"rollout {s.shard}",
            f"{len(pending)} to run, {done_before} already finished: starting {count} envs "
            f"({bound})",
        )
        setting = s.envs_per_shard if s.total_num_envs is None else s.total_num_envs
        self.choices = ShardChoices(setting, s.merged_dispatch, count, bound)
        self._workers = WorkerSet(self.env_workers, count)  # the state of this run, below
        self.envs_started = count
        self.dispatch_log.mark("envs_started")
        self._scheduler = EpisodeScheduler(
            pending, s.expected_batch, done_before, total, self.failures, self.progress
        )
        self._dispatcher: Dispatcher | None = None
        self._merged = False
        self._first_reply = set(range(count))  # workers yet to answer their first start
        self._spare = 0  # workers to close as their episode ends (rollout.total_num_envs auto)
        self._ready: dict[int, tuple[Observation, float]] = {}  # observations awaiting actions
        self._chunk_sent: dict[int, float] = {}  # worker -> when its chunk left (step times)
        self._prebuilt: dict[int, Any] = {}  # merged: each ready observation's request
        self._sent_at: dict[int, float] = {}  # batch id -> when it left (monotonic)
        self._parts: dict[int, int] = {}  # batch id -> its requests not yet answered
        self._prompt_of_task: dict[tuple[str, int], Any] = {}  # seen prompts, for siblings
        self._bad_in_a_row = 0  # consecutive unusable policy answers
        fatal: BaseException | None = None
        self.server.start(wake=self.calls.wake)
        try:
            for worker in self._workers:
                self._start(worker, self._scheduler.next_for(worker.index))
            while not self._scheduler.all_done:
                if self._dispatcher is None and (info := self.server.result()) is not None:
                    self._on_server(info)
                conns = [w.conn for w in self._workers.active if w.busy]
                now = time.monotonic()
                wake = self._dispatcher.next_decision(now) if self._dispatcher else None
                timeout = 1.0 if wake is None else min(1.0, wake)
                for ready in wait([*conns, self.calls.wake_reader], timeout=timeout):
                    if ready is not self.calls.wake_reader:
                        self._on_env_message(self._workers.by_conn(ready))
                self.calls.drain_wake()
                if self._dispatcher is not None:
                    self._on_policy_answers()
                    self._send_due()
                    self._maybe_choose()
                    self._waiting.check(self._sent_at, time.monotonic())
        except BaseException as exc:
            fatal = exc
            raise
        finally:
            self.calls.close(wait=fatal is None)
            # a failing shard loses its in-flight episodes anyway: don't wait for envs
            self._workers.close(kill=fatal is not None)
            unchosen = self._unchosen()
            self.choices.close(  # what was never chosen stays as it ran
                self.envs_started, None if self._dispatcher is None else self._dispatcher.as_ready
            )
            self._log_choices(unchosen)

    def _on_server(self, info: ServerInfo) -> None:
        """The server is known: set the dispatch up and let the observations held so far go."""
        s = self.settings
        assert self.choices is not None
        self.url, self.max_batch_size = info.url, info.max_batch
        self.server_batch = info.server_batch
        self._waiting = WaitingLog(self.failures, self.url, s.shard, s.event_log)
        # A server that merges requests itself (SGLang's dynamic batching) merges any prompts
        # (an action request's prompt is not in its batch signature: sglang/multimodal_gen/
        # configs/sample/action.py): one queue (and rollout.merged_dispatch says how it leaves).
        self._merged = self.server_batch > self.max_batch_size
        self._scheduler.batch_size = 1 if self._merged else self.max_batch_size
        self.max_inflight = s.max_inflight_requests or -(-self.envs_started // self.server_batch)
        unchosen = self._unchosen()
        as_ready = self.choices.on_server(self._merged)
        self._log_choices(unchosen)
        self._dispatcher = Dispatcher(
            self.server_batch,
            self.max_inflight,
            s.batch_timeout_s,
            LatencyModel.from_capacity(info.capacity),
            as_ready,
        )
        self.dispatch_log.mark("service_ready", info.ready_at)
        self.dispatch_log.server = info.record
        log_event(
            s.event_log,
            f"rollout {s.shard}",
            f"rank {s.shard} -> {self.url} ({self._scheduler.total - self._scheduler.done} "
            f"to run, {self._scheduler.done} already finished, {self.envs_started} envs)",
        )
        parts = -(-self.server_batch // self.max_batch_size)
        self.calls.start(s.endpoint.at(self.url), self.max_inflight * parts)
        for index in sorted(self._ready, key=lambda i: self._ready[i][1]):  # held meanwhile
            self._enqueue(index)

    def _maybe_choose(self) -> None:
        """Choose the envs and dispatch left to the run once measured (`auto`)."""
        assert self.choices is not None and self._dispatcher is not None
        active = len(self._workers.active)
        model = self._dispatcher.model
        # chosen while every env has an episode: in the run's tail the envs run out anyway
        if model is None or not self._scheduler.to_start or not self.choices.due(active):
            return
        unchosen = self._unchosen()
        keep, as_ready = self.choices.choose(
            active, self.server_batch, model.typical(), self.settings.batch_timeout_s
        )
        self._spare = max(0, active - keep)
        if as_ready is not None:
            self._dispatcher.as_ready = as_ready
        if self.settings.max_inflight_requests is None:
            self._dispatcher.max_inflight = -(-keep // self.server_batch)
        self._log_choices(unchosen)

    def _unchosen(self) -> set[str]:
        assert self.choices is not None
        return {name for name in ("envs", "dispatch") if getattr(self.choices, name) is None}

    def _log_choices(self, unchosen: set[str]) -> None:
        """Log the choices made since `unchosen` was taken ("envs: ...", "dispatch: ...")."""
        s = self.settings
        for name in sorted(unchosen, reverse=True):  # envs first
            choice = getattr(self.choices, name)
            if choice is not None:
                log_event(s.event_log, f"rollout {s.shard}", f"{name}: {choice.reason}")

    def _start(self, worker: EnvWorker, episode: Episode) -> None:
        self._send_start(worker, self._scheduler.start(worker.index, episode))

    def _send_start(self, worker: EnvWorker, running: RunningEpisode) -> None:
        """Send `worker` the episode it now runs."""
        episode = running.episode
        spec = EpisodeSpec(episode.suite, episode.task_id, episode.init_state_id, seed=episode.seed)
        worker.send(Command.START, spec)
        self.dispatch_log.env(worker.index, "stepping", time.monotonic())

    def _finish(self, worker: EnvWorker, record: dict[str, Any]) -> None:
        """Store and log `worker`'s finished episode, then start its next one; a worker with
        none left (or a spare one) closes at once."""
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
        spare = self._spare > 0 and len(self._workers.active) > 1
        following = self._scheduler.finish(worker.index, record["success_once"], not spare)
        if following is not None:
            self._start(worker, following)
        else:
            self._spare -= int(spare)
            self._workers.retire(worker.index)

    def _fail(self, worker: EnvWorker, message: str) -> None:
        info = self._scheduler.running_on(worker.index)
        self._finish(
            worker, episode_record(self.settings, info.episode, info, self.url, error=message)
        )

    def _on_env_message(self, worker: EnvWorker) -> None:
        """An env worker answered: its env died or raised, its episode ended, or it is ready."""
        s = self.settings
        status, result = worker.receive()
        now = time.monotonic()
        self._on_first_reply(worker.index)
        sent = self._chunk_sent.pop(worker.index, None)
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
                video = save_video(result.frames, s.video_dir, info.episode, result.success_once)
            record = episode_record(s, info.episode, info, self.url, result, video_path=video)
            self._finish(worker, record)
        else:
            info.task_language = result.task_language
            if sent is not None and self.choices is not None:
                self.choices.step_s.append(now - sent)
            self.dispatch_log.work(now, None if sent is None else now - sent, worker.work)
            self._ready[worker.index] = (result, now)
            self.dispatch_log.env(worker.index, "waiting", now)
            if self._dispatcher is not None:
                self._enqueue(worker.index)

    def _on_first_reply(self, index: int) -> None:
        """Note when the last of the envs started has answered its first start."""
        if index not in self._first_reply:
            return
        self._first_reply.discard(index)
        if self._first_reply or not self.dispatch_log.mark("envs_ready"):
            return
        timeline = self.dispatch_log.timeline
        ready, start = timeline["envs_ready"], timeline["job_start"]
        assert ready is not None
        took = f" in {ready - start:.1f} s" if start is not None else ""
        server = timeline["service_ready"]
        when = (
            "before the server was ready"
            if server is None
            else f"after the server was ready, {ready - server:.1f} s later"
        )
        s = self.settings
        log_event(
            s.event_log,
            f"rollout {s.shard}",
            f"envs ready: {self.envs_started} envs{took} ({when})",
        )

    def _enqueue(self, index: int) -> None:
        """Worker `index`'s observation goes into the dispatcher's queue of its prompt."""
        assert self._dispatcher is not None
        observation, since = self._ready[index]
        episode = self._scheduler.running_on(index).episode
        key = "" if self._merged else self.adapter.prompt_key(observation)
        self._prompt_of_task[(episode.suite, episode.task_id)] = key
        if self._merged:
            self._prebuilt[index] = self.calls.build([observation])
        self._dispatcher.ready(index, key, since)

    def _on_policy_answers(self) -> None:
        """Hand the finished policy calls' action chunks to their workers."""
        assert self._dispatcher is not None
        for request, batch, (status, value, latency, answered_at, left_at) in self.calls.answers():
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
                    now = time.monotonic()  # before the worker can start on it
                    worker.send(Command.CHUNK, value[position])
                    self._chunk_sent[index] = now
                    self.dispatch_log.env(index, "stepping", now)

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

    def _send_due(self) -> None:
        """Send the requests the dispatcher says are due (see `dispatch.Dispatcher`)."""
        assert self._dispatcher is not None
        coming: dict[Any, int] = {}  # per prompt: running envs whose observation will come
        for worker in self._workers.active:
            if worker.index not in self._ready and self._scheduler.is_running(worker.index):
                episode = self._scheduler.running_on(worker.index).episode
                key = self._prompt_of_task.get((episode.suite, episode.task_id))
                if key is not None:
                    coming[key] = coming.get(key, 0) + 1
        now = time.monotonic()
        for request, indices in self._dispatcher.due(now, coming):
            if self.dispatch_log.mark("first_request", self.dispatch_log.wall(now)):
                self._log_first_request()
            batch = [(index, self._ready.pop(index)[0]) for index in indices]
            parts = [
                batch[i : i + self.max_batch_size]
                for i in range(0, len(batch), self.max_batch_size)
            ]
            self._sent_at[request], self._parts[request] = now, len(parts)
            for part in parts:
                prebuilt = self._prebuilt.pop(part[0][0], None) if self._merged else None
                self.calls.submit((request, part, prebuilt))

    def _log_first_request(self) -> None:
        timeline, s = self.dispatch_log.timeline, self.settings
        first, ready = timeline["first_request"], timeline["service_ready"]
        assert first is not None and ready is not None
        log_event(
            s.event_log,
            f"rollout {s.shard}",
            f"first request {first - ready:.1f} s after the server was ready",
        )
