"""One LIBERO env in a worker process (`EnvWorker`), and what goes over its pipe: a `Command`
with its payload one way (`EpisodeSpec`, an action chunk, None), a `Reply` (`Status` and
result) the other, with the `WorkTime` the worker spent on the command. The env itself is
`libero_eval.rollout.libero_env.LiberoEpisodeEnv`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
import traceback
from enum import StrEnum
from typing import Any, NamedTuple

from libero_eval.rollout.libero_env import EnvSettings, LiberoEpisodeEnv
from libero_eval.rollout.protocols import EpisodeProtocol


class Command(StrEnum):
    """What the shard asks of an env worker (payload: `EpisodeSpec`, an action chunk, None)."""

    START = "start"
    CHUNK = "chunk"
    CLOSE = "close"


class Status(StrEnum):
    """How an env worker's command ended."""

    OK = "ok"  # result: the next `Observation`, or the `EpisodeOutcome`
    ERROR = "error"  # result: the env's error and traceback
    DIED = "died"  # result: what happened to the process (set by the shard's side)


class Reply(NamedTuple):
    status: Status
    result: Any


class WorkTime(NamedTuple):
    """What one command took inside its worker: wall and CPU seconds (the process's), and the
    seconds of it its cameras spent rendering (None where the env renders every step)."""

    wall_s: float
    cpu_s: float
    render_s: float | None


# -- worker process ----------------------------------------------------------------------------
def _worker_main(
    conn,
    settings: EnvSettings,
    protocol: EpisodeProtocol,
    name: str = "libero-env",
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if settings.env_niceness:  # the server sharing the node's cores runs first
        os.nice(settings.env_niceness)
    _exit_with_parent(name)
    env = LiberoEpisodeEnv(settings, protocol)
    while True:
        try:
            command, payload = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if command == Command.CLOSE:
            break
        try:
            wall, cpu, render = time.perf_counter(), time.process_time(), env.render_seconds
            if command == Command.START:
                result: Any = env.start_episode(payload)
            elif command == Command.CHUNK:
                result = env.step_chunk(payload)
            else:
                raise ValueError(f"unknown worker command {command!r}")
            rendered = env.render_seconds
            work = WorkTime(
                time.perf_counter() - wall,
                time.process_time() - cpu,
                None if render is None or rendered is None else rendered - render,
            )
            conn.send((*Reply(Status.OK, result), work))
        except Exception as exc:  # noqa: BLE001 - reported to the shard as the episode's error
            env.close()  # a failed env may be in any state: rebuild it for the next episode
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
            conn.send(Reply(Status.ERROR, error))
    env.close()


def _exit_with_parent(name: str) -> None:
    """Ask Linux to SIGKILL this worker when its parent (the shard process) dies, and name it
    (`/proc/PID/comm`, what `ps` and psutil's name() show) so leftovers are easy to find."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        parent = mp.parent_process()
        if parent is not None and os.getppid() != parent.pid:
            os._exit(1)  # the shard died before the death signal was armed
    except Exception:  # noqa: BLE001 - best effort on non-Linux
        pass


class EnvWorker:
    """A LiberoEpisodeEnv in a child process; requests are asynchronous (send, then poll)."""

    def __init__(
        self,
        index: int,
        settings: EnvSettings,
        protocol: EpisodeProtocol,
    ):
        self.index = index
        self.settings = settings
        self.protocol = protocol
        self.conn = None
        self.process = None
        self.busy = False
        self.work: WorkTime | None = None  # what its last reply's command took in the worker
        self.start()

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main,
            args=(
                child_conn,
                self.settings,
                self.protocol,
                f"libero-env-{self.index}",
            ),
            name=f"libero-env-{self.index}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        self.conn = parent_conn
        self.busy = False

    def send(self, command: Command, payload: Any) -> None:
        self.conn.send((Command(command), payload))
        self.busy = True

    def receive(self) -> Reply:
        """The worker's reply; `Status.DIED` with a message if the process is gone. What its
        command took in the worker is then `work` (None where it did not say)."""
        self.work = None
        try:
            status, result, *work = self.conn.recv()
            reply = Reply(status, result)
            self.work = WorkTime(*work[0]) if work else None
        except (EOFError, OSError):
            self.process.join(timeout=5)
            exit_code = self.process.exitcode
            reply = Reply(Status.DIED, f"env worker process died (exit code {exit_code})")
        self.busy = False
        return reply

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        """Stop at once (the shard is failing: an episode in flight is lost anyway)."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        self.join(5)

    def request_close(self) -> None:
        """Ask the worker to close its env and exit; returns at once (then `join`)."""
        if self.process is not None and self.process.is_alive():
            with contextlib.suppress(OSError):  # BrokenPipeError: it is gone already
                self.conn.send((Command.CLOSE, None))

    def join(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the process to exit, kill it after that, forget it."""
        if self.process is None:
            return
        self.process.join(timeout=max(0.0, timeout_s))
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()
        self.process = None

    def stop(self) -> None:
        self.request_close()
        self.join(10)
