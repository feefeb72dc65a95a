"""Process plumbing shared by the serve side and the rollout side.

A serve job announces its server in a service file (`write_service_file`); a rollout job waits
for that file and for the server's `/health` (`wait_for_service`). Both follow their parent
(Snakemake) into death with `ParentWatch`. Neither side imports the other: both import this.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and loopback addresses."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def proxies_apply(url: str) -> bool:
    """Whether requests to ``url`` may go through the environment's proxy (``HTTP_PROXY``,
    ``NO_PROXY``, as requests reads them): never for a loopback URL, where a cluster's
    ``http_proxy`` must not capture ``127.0.0.1``; as the environment says for another host
    (a server the user runs there, ``server.backend: url``)."""
    return not is_loopback(urlsplit(url).hostname)


class ServiceUnavailableError(RuntimeError):
    """A consumer could not reach the server announced by a service file."""


class ServiceWaitTimeout(ServiceUnavailableError, TimeoutError):
    """The service file or its `/health` did not become ready before the deadline."""


# --------------------------------------------------------------------------- parent death

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `signum` to this process when its parent dies (prctl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class ParentWatch:
    """Calls `on_parent_death(old_ppid)` once when this process's parent goes away.

    Two mechanisms: prctl(PR_SET_PDEATHSIG, SIGTERM) (the process must handle SIGTERM, e.g.
    by requesting a stop; the handler can tell this case by `parent_gone()`), and a daemon
    thread that notices a change of os.getppid() (reparenting to init or a subreaper).
    """

    def __init__(self, on_parent_death: Callable[[int], None], poll_s: float = 0.5):
        self.original_ppid = os.getppid()
        self._on_parent_death = on_parent_death
        self._poll_s = poll_s
        self._fired = threading.Event()
        self._stopped = threading.Event()

    def parent_gone(self) -> bool:
        return os.getppid() != self.original_ppid

    def start(self) -> ParentWatch:
        set_parent_death_signal(signal.SIGTERM)
        thread = threading.Thread(target=self._run, name="parent-watch", daemon=True)
        thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        # The first check runs at once: the parent may have died before prctl was armed.
        while not self._stopped.is_set():
            if self.parent_gone() and not self._fired.is_set():
                self._fired.set()
                self._on_parent_death(self.original_ppid)
                return
            self._stopped.wait(self._poll_s)


# --------------------------------------------------------------------------- service file


def write_service_file(path: str | os.PathLike[str], info: Mapping[str, Any]) -> None:
    """Write `info` as JSON atomically (temporary file + os.replace)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(dict(info), handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)


def read_service_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The service file's content, or None while it is missing or not valid JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def wait_for_service(
    service_file: str | os.PathLike[str],
    timeout_s: float,
    poll_s: float = 1.0,
    log_path: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Wait until the service file says "ready" and its URL's readiness path (`health_path`
    in the file, `/health` by default) answers 200, at most ``timeout_s`` (the caller's
    `server.health_timeout_s`).

    Returns the service file's content (keys slot, url, pid, pgid, backend, status, ...).
    Raises ServiceUnavailableError at once if the launcher reported "failed"/"stopped", and
    ServiceWaitTimeout when the deadline passes; both name the file and the serve log.
    """
    deadline = time.monotonic() + timeout_s
    see_log = f"; see the serve log {log_path}" if log_path else ""
    last_state = "the file does not exist yet"
    with requests.Session() as session:
        session.trust_env = False  # set per URL below, once the file names one
        while True:
            info = read_service_file(service_file)
            if info is not None:
                status = info.get("status")
                if status in ("failed", "stopped"):
                    reason = info.get("error") or "no reason given"
                    raise ServiceUnavailableError(
                        f"server behind {service_file} is {status}: {reason}{see_log}"
                    )
                url = info.get("url")
                if status != "ready" or not isinstance(url, str):
                    last_state = f"status is {status!r}"
                else:
                    remaining = deadline - time.monotonic()
                    health_url = url + str(info.get("health_path") or "/health")
                    session.trust_env = proxies_apply(url)
                    try:
                        response = session.get(health_url, timeout=max(0.5, min(5.0, remaining)))
                        if response.status_code == 200:
                            return info
                        last_state = f"{health_url} answered HTTP {response.status_code}"
                    except requests.RequestException as exc:
                        last_state = f"{health_url} failed: {type(exc).__name__}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServiceWaitTimeout(
                    f"server behind {service_file} not ready after {timeout_s:g} s "
                    f"({last_state}){see_log}"
                )
            time.sleep(min(poll_s, remaining))


def wait_for_gpu(
    service_file: str | os.PathLike[str], timeout_s: float, poll_s: float = 0.2
) -> int | list[int]:
    """The GPU(s) a serve job took from its pool (`gpu_id` in its service file, written as soon
    as it holds them, before its server starts), at most ``timeout_s``; raises
    ServiceUnavailableError when the job failed or stopped first, ServiceWaitTimeout after."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = read_service_file(service_file) or {}
        if info.get("gpu_id") is not None:
            return info["gpu_id"]
        if info.get("status") in ("failed", "stopped"):
            raise ServiceUnavailableError(
                f"server behind {service_file} is {info['status']} before it took a GPU: "
                f"{info.get('error') or 'no reason given'}"
            )
        if time.monotonic() >= deadline:
            raise ServiceWaitTimeout(
                f"server behind {service_file} took no GPU within {timeout_s:g} s "
                f"({info.get('note') or info.get('status') or 'no service file yet'})"
            )
        time.sleep(poll_s)


def capacity_of(service_file: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The server's own capacity, as the serve job measured it at start
    (`libero_eval.policy.capacity`): ``{"max_batch_size", "probes", "obs_per_s"}``; None when
    the file or the entry is missing (the probe failed or was not run)."""
    info = read_service_file(service_file)
    capacity = info.get("capacity") if info else None
    return capacity if isinstance(capacity, dict) else None
