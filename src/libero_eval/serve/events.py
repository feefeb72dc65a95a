"""What a serve job says and when it stops: its lines on its own output (the serve log), its
milestone lines in the run's event log, the capacity line, and the stop flag its signal
handlers set. The serve job (`libero_eval.serve.job`) and a URL slot
(`libero_eval.serve.url_server`) share them."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Any

from libero_eval.eventlog import log_event


class StopRequest:
    """A stop flag safe to set from a signal handler (no locks, unlike threading.Event)."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def is_set(self) -> bool:
        return self.reason is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` seconds in short slices; True once a stop is requested."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                break
            time.sleep(left)
        return self.is_set()


def now_iso() -> str:
    """Now, as the service file's times read (local time with its offset, seconds)."""
    return datetime.now().astimezone().isoformat(timespec="seconds")


class EventLog:
    """Milestone lines `YYYY-mm-dd HH:MM:SS [serve slot=K] <message>` in the run's event log."""

    def __init__(self, path: str | None, slot: int):
        self.path = path
        self.source = f"serve slot={slot}"

    def write(self, message: str) -> None:
        try:
            log_event(self.path, self.source, message)
        except OSError as exc:
            say(f"cannot append to the event log {self.path}: {exc}", error=True)


def say(message: str, error: bool = False) -> None:
    """A line of the serve job's own output (the serve log), stderr for an error."""
    stream = sys.stderr if error else sys.stdout
    print(f"[libero_eval.serve.job] {message}", file=stream, flush=True)


def describe_capacity(capacity: dict[str, Any]) -> str:
    """The event log's line: ``capacity: batch 1 in 0.84 s, batch 8 in 2.16 s: 3.70 obs/s``."""
    probes = ", ".join(
        f"batch {p['observations']}"
        + (f" ({p['requests']} requests)" if p["requests"] > 1 else "")
        + f" in {p['seconds']:.2f} s"
        for p in capacity["probes"]
    )
    return f"capacity: {probes}: {capacity['obs_per_s']:.2f} obs/s"
