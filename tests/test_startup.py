"""A shard's start and end around a real HTTP server (the reference server), with env workers
whose env is a thread (no LIBERO): the envs come up while the shard waits for its server, the
first request waits for both, workers close as soon as they have no episode left and the rest
together, and a failure on either side during the start stops the other side. Every wait is on
an event (the envs' first answers, a thread's end), never on a deadline.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import signal
import threading
import time
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from libero_eval.config import RunSettings
from libero_eval.plan import Episode
from libero_eval.policy.adapter import Observation
from libero_eval.reference.server import serve_in_thread
from libero_eval.reference.settings import ReferenceServerSettings
from libero_eval.rollout import auto
from libero_eval.rollout.dispatch_log import TIMELINE
from libero_eval.rollout.env_worker import Command, Reply, Status
from libero_eval.rollout.libero_env import EpisodeOutcome
from libero_eval.rollout.shard_run import run_shard
from libero_eval.service import ServiceUnavailableError
from libero_eval.settings_schema import defaults
from libero_eval.store import EpisodeStore

REPO = Path(__file__).resolve().parents[1]
STATS = REPO / "src" / "libero_eval" / "data" / "stats"
EPISODES = [Episode("libero_spatial", task, trial) for trial in range(3) for task in (0, 1)]
QUERIES = 4  # each episode: its first observation, 3 chunks answered by observations, its end


class Journal:
    """What the fake envs did, in order, shared by a shard's workers."""

    def __init__(self, workers: int):
        self.lines: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.first_answers = threading.Semaphore(0)
        self.workers = workers

    def add(self, what: str, index: int) -> None:
        with self.lock:
            self.lines.append((what, index))

    def wait_for_first_answers(self) -> None:
        for _ in range(self.workers):
            self.first_answers.acquire()


class FakeProcess:
    def __init__(self, thread: threading.Thread, conn: Any):
        self.thread, self.conn, self.killed = thread, conn, False

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def kill(self) -> None:
        self.killed = True
        self.conn.close()  # the env thread's recv ends

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)


class FakeWorker:
    """`EnvWorker`'s interface; its env runs on a thread: an observation for START and for
    each chunk, the episode's end after `QUERIES` queries."""

    def __init__(self, index: int, journal: Journal):
        self.index, self.journal, self.busy = index, journal, False
        self.work = None  # what a command took in the worker: not measured here
        self.conn, child = Pipe()
        thread = threading.Thread(target=self._env, args=(child,), daemon=True)
        self.process: FakeProcess | None = FakeProcess(thread, self.conn)
        self.closed_by_request = False
        thread.start()

    def _env(self, conn: Any) -> None:
        queries, answered = 0, False
        image = np.zeros((64, 64, 3), dtype=np.uint8)
        while True:
            try:
                command, payload = conn.recv()
            except (EOFError, OSError):
                return
            if command == Command.CLOSE:
                self.journal.add("close", self.index)
                return
            if command == Command.START:
                queries = 1
                reply = Observation(image, image, f"task {payload.task_id}")
            else:
                queries += 1
                reply = (
                    EpisodeOutcome(False, False, None, 8)
                    if queries > QUERIES
                    else Observation(image, image, "same task")
                )
            if isinstance(reply, EpisodeOutcome):
                self.journal.add("episode end", self.index)
            conn.send(tuple(Reply(Status.OK, reply)))
            if not answered:
                answered = True
                self.journal.first_answers.release()

    def send(self, command: Command, payload: Any) -> None:
        self.conn.send((command, payload))
        self.busy = True

    def receive(self) -> Reply:
        reply = Reply(*self.conn.recv())
        self.busy = False
        return reply

    def request_close(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.closed_by_request = True
            # as EnvWorker.request_close: a worker that closed meanwhile is gone already
            with contextlib.suppress(OSError):
                self.conn.send((Command.CLOSE, None))

    def join(self, timeout_s: float) -> None:
        if self.process is not None:
            self.process.join(max(0.0, timeout_s))
            self.conn.close()
            self.process = None


def shard(tmp_path: Path, envs: int, **rollout: Any):
    config = {
        "run_id": "startup",
        "server": {"reference": {"policy": "hold"}},
        "rollout": {"send_privileged_state": False, "camera_size": 64, **rollout},
    }
    from libero_eval.config import validate_config

    validate_config(config)
    settings = RunSettings(config).shard_settings("shard000", 0, envs, tmp_path / "events.log")
    return settings, EpisodeStore(tmp_path / "episodes")


def reference(**latency: float) -> ReferenceServerSettings:
    return ReferenceServerSettings(
        family_settings={
            "action_stats_path": STATS / "libero_native_frame_wise_relative_rot6d.json"
        },
        policy="hold",
        max_batch_size=2,
        **latency,
    )


def workers_of(journal: Journal, made: list[FakeWorker]):
    def make(index: int) -> FakeWorker:
        worker = FakeWorker(index, journal)
        made.append(worker)
        return worker

    return make


def test_envs_come_up_while_the_server_is_awaited_and_the_first_request_waits(tmp_path):
    settings, store = shard(tmp_path, envs=2)
    events = tmp_path / "events.log"
    journal, made = Journal(workers=2), []
    with serve_in_thread(reference()) as url:

        def service() -> tuple[str, None]:  # ready once the shard saw every env's answer
            journal.wait_for_first_answers()
            while "envs ready" not in events.read_text():
                time.sleep(0.01)  # an event to wait on: the shard's own log line
            return url, None

        records = run_shard(
            EPISODES,
            settings,
            store,
            None,
            tmp_path / "s.parquet",
            progress=False,
            dispatch_log=tmp_path / "d.json",
            env_workers=workers_of(journal, made),
            wait_for_service=service,
        )
    assert [r["error"] for r in records] == [None] * len(EPISODES)
    log = json.loads((tmp_path / "d.json").read_text())
    timeline = log["timeline"]
    assert set(timeline) == set(TIMELINE) and None not in timeline.values()
    order = [timeline[key] for key in TIMELINE]
    assert order == sorted(order)  # job start, envs started, envs ready, server ready, ...
    assert timeline["first_request"] == min(r[0] for r in log["requests"])
    assert timeline["last_answer"] == max(r[1] for r in log["requests"])
    assert log["envs_choice"] == {"envs": 2, "setting": 2, "reason": log["envs_choice"]["reason"]}
    assert log["dispatch_choice"]["merged_dispatch"] is None  # Cosmos3: the server does not merge
    lines = events.read_text()
    assert "envs ready: 2 envs in" in lines and "(before the server was ready)" in lines
    assert "s after the server was ready" in lines and "s after its last answer" in lines
    # each worker closed on request once it had no episode left, none was killed
    assert all(w.closed_by_request and not w.process for w in made)


def test_a_worker_with_no_episode_left_closes_while_the_others_run(tmp_path):
    settings, store = shard(tmp_path, envs=2)
    journal, made = Journal(workers=2), []
    episodes = EPISODES[:3]  # one worker runs two, the other one
    with serve_in_thread(reference()) as url:
        run_shard(
            episodes,
            settings,
            store,
            url,
            tmp_path / "s.parquet",
            progress=False,
            env_workers=workers_of(journal, made),
        )
    lines = journal.lines
    first_close = lines.index(next(line for line in lines if line[0] == "close"))
    ends = [i for i, line in enumerate(lines) if line[0] == "episode end"]
    assert len(ends) == 3 and first_close < ends[-1]


def test_a_server_that_fails_while_the_envs_start_stops_them(tmp_path):
    settings, store = shard(tmp_path, envs=2)
    journal, made = Journal(workers=2), []

    def service() -> tuple[str, None]:
        journal.wait_for_first_answers()
        raise ServiceUnavailableError("server behind slot0.json is failed: no GPU")

    with pytest.raises(ServiceUnavailableError, match="no GPU"):
        run_shard(
            EPISODES,
            settings,
            store,
            None,
            tmp_path / "s.parquet",
            progress=False,
            env_workers=workers_of(journal, made),
            wait_for_service=service,
        )
    assert len(made) == 2 and all(w.process is None for w in made)  # stopped, not left
    assert not (tmp_path / "s.parquet").exists()


def test_env_workers_that_cannot_start_stop_those_started(tmp_path):
    settings, store = shard(tmp_path, envs=3)
    journal, made = Journal(workers=3), []
    make = workers_of(journal, made)

    def second_fails(index: int) -> FakeWorker:
        if index == 1:
            raise OSError("cannot fork: out of memory")
        return make(index)

    waited = threading.Event()

    def service() -> tuple[str, None]:
        waited.set()
        raise AssertionError("a shard whose envs cannot start must not need its server")

    with pytest.raises(OSError, match="cannot fork"):
        run_shard(
            EPISODES,
            settings,
            store,
            None,
            tmp_path / "s.parquet",
            progress=False,
            env_workers=second_fails,
            wait_for_service=service,
        )
    assert len(made) == 1 and made[0].process is None and not waited.is_set()


def test_a_stop_during_the_wait_for_the_server_kills_the_envs_at_once(tmp_path):
    """SIGTERM's handler raises in the main thread (shard_job); interrupt_main does the same.
    It simulates SIGINT, which raises only under Python's own handler: a test that ran before
    in this process (serve.job, shard_job, interrupt) may have left SIGINT at SIG_DFL."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _stop_during_the_wait(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_during_the_wait(tmp_path) -> None:
    settings, store = shard(tmp_path, envs=2)
    journal, made = Journal(workers=2), []

    def service() -> tuple[str, None]:
        journal.wait_for_first_answers()
        _thread.interrupt_main()
        threading.Event().wait()  # the server never comes
        raise AssertionError("unreachable")

    with pytest.raises(KeyboardInterrupt):
        run_shard(
            EPISODES,
            settings,
            store,
            None,
            tmp_path / "s.parquet",
            progress=False,
            env_workers=workers_of(journal, made),
            wait_for_service=service,
        )
    assert all(w.process is None and not w.closed_by_request for w in made)  # killed


def test_a_resumed_shard_with_every_episode_finished_needs_no_server(tmp_path):
    settings, store = shard(tmp_path, envs=2)
    journal, made = Journal(workers=2), []
    with serve_in_thread(reference()) as url:
        run_shard(
            EPISODES[:2],
            settings,
            store,
            url,
            tmp_path / "a.parquet",
            progress=False,
            env_workers=workers_of(journal, made),
        )

    def service() -> tuple[str, None]:
        raise AssertionError("no server is needed")

    made.clear()
    records = run_shard(
        EPISODES[:2],
        settings,
        store,
        None,
        tmp_path / "b.parquet",
        progress=False,
        dispatch_log=tmp_path / "d.json",
        env_workers=workers_of(journal, made),
        wait_for_service=service,
    )
    assert len(records) == 2 and made == []
    log = json.loads((tmp_path / "d.json").read_text())
    assert log["envs_choice"]["envs"] == 0 and log["episodes_run"] == 0
    assert log["timeline"]["service_ready"] is None and log["timeline"]["shard_end"] is not None


def test_auto_envs_close_the_spare_workers_as_their_episode_ends(tmp_path, monkeypatch):
    """The choice itself is tested on plain numbers (tests/test_auto.py); here the runner
    applies one: of 4 envs started it keeps 2, the 2 spare close as their episode ends."""
    chosen = []

    def keep_two(setting, started, server_batch, batch_s, step_s):
        chosen.append((setting, started, server_batch, len(step_s)))
        return auto.Choice(2, setting, "2 of the 4 envs started (test)")

    monkeypatch.setattr(auto, "choose_envs", keep_two)
    settings, store = shard(tmp_path, envs=4, total_num_envs="auto", envs_per_shard=4)
    episodes = [Episode("libero_spatial", task, trial) for trial in range(6) for task in (0, 1)]
    journal, made = Journal(workers=4), []
    with serve_in_thread(reference()) as url:
        records = run_shard(
            episodes,
            settings,
            store,
            url,
            tmp_path / "s.parquet",
            progress=False,
            dispatch_log=tmp_path / "d.json",
            env_workers=workers_of(journal, made),
        )
    assert len(records) == 12 and all(r["error"] is None for r in records)
    assert chosen == [("auto", 4, 2, chosen[0][3])] and chosen[0][3] >= 2 * 4
    log = json.loads((tmp_path / "d.json").read_text())
    assert log["envs_started"] == 4 and log["envs"] == 2
    assert log["envs_choice"] == {
        "envs": 2,
        "setting": "auto",
        "reason": "2 of the 4 envs started (test)",
    }
    ends = {index: 0 for index in range(4)}
    closes = []
    for what, index in journal.lines:
        if what == "episode end":
            ends[index] += 1
        else:
            closes.append((index, sum(ends.values())))
    # the 2 spare workers closed with episodes left to run; the others once none was left
    # to start (10 or more of the 12 done with 2 workers left)
    assert len(closes) == 4 and [done < 10 for _, done in closes] == [True, True, False, False]
    assert "envs: 2 of the 4 envs started (test)" in (tmp_path / "events.log").read_text()


def test_the_merged_dispatch_default_is_auto():
    assert defaults("rollout")["merged_dispatch"] == "auto"
