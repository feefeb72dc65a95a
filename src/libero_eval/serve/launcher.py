"""Start a policy server as its own process group, wait for `/health`, tear it all down.

`ManagedServer` runs the built-in reference server, `sglang serve` or openpi's policy server
(`scripts/serve_policy.py`, a configurable command) in a new session
(its own process group), waits for `GET /health` to answer 200 (failing fast if the process
exits first) and on `stop()` terminates the whole group plus any descendant that left it.
The launcher follows its parent (Snakemake) into death with `libero_eval.service.ParentWatch`;
consumers wait for the service file with `libero_eval.service.wait_for_service`.
Its settings come from `libero_eval.serve.settings`, its argv and environment from
`libero_eval.serve.command`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any, Protocol

import psutil
import requests

from libero_eval.serve.command import build_command, build_env, port_is_free, resolve_port
from libero_eval.serve.settings import ServerSettings
from libero_eval.service import PR_SET_PDEATHSIG

LOG_TAIL_LINES = 40


class ServerStartError(RuntimeError):
    """The server could not be started or did not become healthy."""


class LaunchAborted(RuntimeError):
    """A stop was requested while waiting for the server to become healthy."""


# --------------------------------------------------------------------------- logs


def log_tail(path: str | os.PathLike[str] | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when unreadable)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            data = handle.read()
    except OSError:
        return ""
    tail = deque(data.decode("utf-8", errors="replace").splitlines(), maxlen=lines)
    return "\n".join(tail)


def _path_of_stream(stream: IO[Any]) -> str | None:
    """The regular file behind a stream, if any (for reading the log tail back)."""
    name = getattr(stream, "name", None)
    if isinstance(name, str) and os.path.isfile(name):
        return name
    try:
        fd = stream.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        target = os.readlink(f"/proc/self/fd/{fd}")
    except (OSError, ValueError, AttributeError):
        return None
    return target if os.path.isfile(target) else None


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --------------------------------------------------------------------------- parent death


def _child_parent_death_hook() -> Callable[[], None] | None:
    """A preexec_fn giving the server SIGTERM if the launcher dies without cleaning up."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return hook


# --------------------------------------------------------------------------- the server


class StopSignal(Protocol):
    """What wait_healthy needs of a stop request (threading.Event qualifies)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class ManagedServer:
    """A policy server in its own process group; a context manager that always tears down."""

    def __init__(self, settings: ServerSettings, die_with_launcher: bool = True):
        """`die_with_launcher`: arm PR_SET_PDEATHSIG(SIGTERM) in the server, so it does not
        outlive a launcher killed without cleanup (kill -9)."""
        self.settings = settings
        self.die_with_launcher = die_with_launcher
        self._proc: subprocess.Popen[bytes] | None = None
        self._known: dict[int, psutil.Process] = {}
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._started_monotonic = 0.0
        self.log_path: str | None = None
        self.command: list[str] = []
        self.env: dict[str, str] = {}

    # ---- lifecycle

    def __enter__(self) -> ManagedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self.settings.base_url

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def pgid(self) -> int | None:
        # start_new_session=True makes the server a session and group leader: pgid == pid.
        return self.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    def poll(self) -> int | None:
        """The server's exit code, or None while it runs (or before start)."""
        return None if self._proc is None else self._proc.poll()

    def start(self, log_stream: IO[Any], log_path: str | os.PathLike[str] | None = None) -> None:
        """Spawn the server in a new session, stdout and stderr into `log_stream`.

        `log_path` is where the log can be read back for error messages; by default the
        regular file behind `log_stream`. With `die_with_launcher` the server gets SIGTERM
        when the calling THREAD ends (PR_SET_PDEATHSIG follows the spawning thread): call this
        from a long-lived thread, or pass die_with_launcher=False.
        """
        if self._proc is not None:
            raise RuntimeError("ManagedServer.start() called twice")
        if self.settings.port != 0 and not port_is_free(self.settings.host, self.settings.port):
            raise ServerStartError(
                f"server.port: {self.settings.host}:{self.settings.port} is already in use by "
                "another process; stop it, choose another server.port, or use 0 for a free one"
            )
        self.settings = resolve_port(self.settings)
        self.command = build_command(self.settings)
        self.env = build_env(self.settings)
        self.log_path = str(log_path) if log_path is not None else _path_of_stream(log_stream)
        log_stream.flush()
        try:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log_stream,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=_child_parent_death_hook() if self.die_with_launcher else None,
                cwd=self.settings.openpi.cwd if self.settings.openpi is not None else None,
            )
        except OSError as exc:
            where = {"sglang": "server.sglang.command", "openpi": "server.openpi.command"}.get(
                self.settings.backend, "server"
            )
            raise ServerStartError(
                f"{where}: cannot run {shlex.join(self.command)}: {exc}. Check that the "
                "executable exists (absolute path or on PATH) and is executable"
            ) from exc
        self._started_monotonic = time.monotonic()
        self._known[self._proc.pid] = psutil.Process(self._proc.pid)
        atexit.register(self.stop)

    def failure_report(self, message: str) -> str:
        """`message` followed by the command and the last lines of the server log."""
        tail = log_tail(self.log_path)
        where = f"server log {self.log_path}" if self.log_path else "server log (not a file)"
        text = f"{message}\ncommand: {shlex.join(self.command)}\n--- last lines of {where} ---"
        return f"{text}\n{tail or '(empty)'}"

    def _error(self, message: str) -> ServerStartError:
        return ServerStartError(self.failure_report(message))

    def wait_healthy(self, stop_event: StopSignal | None = None) -> float:
        """Poll GET <url><health_path> until 200; return seconds since launch.

        Raises ServerStartError (with the log tail) when the process exits first or the
        deadline `health_timeout_s` (counted from launch) passes; LaunchAborted when
        `stop_event` is set meanwhile.
        """
        if self._proc is None:
            raise RuntimeError("ManagedServer.wait_healthy() called before start()")
        health_url = f"{self.url}{self.settings.health_path}"
        deadline = self._started_monotonic + self.settings.health_timeout_s
        last_seen = "no answer yet"
        with requests.Session() as session:
            session.trust_env = False  # no proxies for loopback
            while True:
                code = self._proc.poll()
                if code is not None:
                    elapsed = time.monotonic() - self._started_monotonic
                    raise self._error(
                        f"{self.settings.backend} server (slot {self.settings.slot}) "
                        f"{_describe_exit(code)} {elapsed:.1f} s after launch, before "
                        f"{health_url} answered 200"
                    )
                if stop_event is not None and stop_event.is_set():
                    raise LaunchAborted(f"stop requested while waiting for {health_url}")
                remaining = deadline - time.monotonic()
                try:
                    response = session.get(health_url, timeout=max(0.5, min(5.0, remaining)))
                    if response.status_code == 200:
                        self._check_port_owner()
                        return time.monotonic() - self._started_monotonic
                    last_seen = f"HTTP {response.status_code}"
                except requests.RequestException as exc:
                    last_seen = type(exc).__name__
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._error(
                        f"{self.settings.backend} server (slot {self.settings.slot}) did not "
                        f"answer 200 on {health_url} within server.health_timeout_s="
                        f"{self.settings.health_timeout_s:g} s (last: {last_seen}); raise "
                        "server.health_timeout_s if loading the model takes longer"
                    )
                pause = min(self.settings.health_poll_s, remaining)
                if stop_event is not None:
                    stop_event.wait(pause)
                else:
                    time.sleep(pause)

    def _check_port_owner(self) -> None:
        """Fail if /health was answered by a program outside our process tree.

        SGLang silently moves to another port when the requested one is taken, so a foreign
        server on our port would otherwise be mistaken for ours.
        """
        port = self.settings.port
        checked_any = False
        for proc in [*self._known.values(), *self.track_descendants()]:
            try:
                conns = proc.net_connections(kind="inet")
            except psutil.AccessDenied:
                continue
            except psutil.Error:
                continue
            checked_any = True
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
                return
        if checked_any:
            raise self._error(
                f"{self.url}/health answered 200 but no process of the server listens on port "
                f"{port}: another program holds it. Choose another server.port (or 0)"
            )

    def track_descendants(self) -> list[psutil.Process]:
        """Remember the server's current descendants (so ones that leave the group or lose
        their parent can still be killed); returns the live ones."""
        if self._proc is None:
            return []
        found: list[psutil.Process] = []
        for proc in list(self._known.values()):
            if not _is_alive(proc):
                continue
            with contextlib.suppress(psutil.Error):
                found.extend(proc.children(recursive=True))
        for proc in found:
            self._known.setdefault(proc.pid, proc)
        return [p for p in found if _is_alive(p)]

    def send_signal(self, signum: int) -> None:
        """Send `signum` to every process of the server: its process group, and its descendants
        (tracked now) that left the group. For a started server only."""
        self.track_descendants()
        self._signal_all(signum)

    def _group_members(self) -> list[psutil.Process]:
        pgid = self.pgid
        members = []
        for proc in psutil.process_iter():
            if _pgid_of(proc.pid) == pgid and _is_alive(proc):
                members.append(proc)
        return members

    def _survivors(self) -> list[psutil.Process]:
        if self._proc is not None:
            self._proc.poll()  # reap the leader so it does not count as a zombie
        alive = {p.pid: p for p in self._known.values() if _is_alive(p)}
        for proc in self._group_members():
            alive.setdefault(proc.pid, proc)
        return list(alive.values())

    def _signal_all(self, signum: int) -> None:
        pgid = self.pgid
        assert pgid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)
        for proc in self._known.values():
            if _pgid_of(proc.pid) != pgid and _is_alive(proc):
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signum)

    def _wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self._survivors():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def stop(self) -> int | None:
        """Tear down the whole process tree: SIGTERM, grace, SIGKILL; idempotent.

        Returns the server's exit code (None if it was never started).
        """
        with self._stop_lock:
            if self._proc is None or self._stopped:
                return self.returncode
            self._stopped = True
            try:
                self.track_descendants()  # before signalling: children may re-parent after
                self._signal_all(signal.SIGTERM)
                if not self._wait_gone(self.settings.teardown_grace_s):
                    self.track_descendants()
                    self._signal_all(signal.SIGKILL)
                    self._wait_gone(5.0)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5.0)
            finally:
                atexit.unregister(self.stop)
            return self._proc.returncode
