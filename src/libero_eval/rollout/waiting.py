"""A shard that waits for its policy server says so: the oldest unanswered request's age and
the settings that bound the wait, at a steady pace (`rollout.failures.waiting_log_every_s`).

Without it a server that never answers stalls a shard silently for as long as every try may
take (`FailurePolicy.longest_wait_s`: the request timeout times the tries, with the backoffs).
The runner calls `WaitingLog.check` from its loop, which wakes at least once a second.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from libero_eval.eventlog import log_event
from libero_eval.failures import PREFIX, FailurePolicy


class WaitingLog:
    """Says how long shard `shard` has waited for `url`'s answers, to its log (stderr) and
    the run's event log: once a request is `waiting_log_every_s` old, and every
    `waiting_log_every_s` after, while any is."""

    def __init__(self, failures: FailurePolicy, url: str, shard: str, event_log: Path | None):
        self.failures = failures
        self.url = url
        self.shard = shard
        self.event_log = event_log
        self._said_at: float | None = None

    def check(self, sent_at: Mapping[object, float], now: float) -> str | None:
        """`sent_at`: each unanswered request's send time (monotonic). Returns the line said,
        if one was due."""
        every = self.failures.waiting_log_every_s
        if not sent_at:
            self._said_at = None
            return None
        age = now - min(sent_at.values())
        if age < every or (self._said_at is not None and now - self._said_at < every):
            return None
        self._said_at = now
        f = self.failures
        line = (
            f"waiting for policy server {self.url}: {len(sent_at)} request(s) unanswered, the "
            f"oldest sent {age:.0f} s ago. Each try may take {PREFIX}request_timeout_s="
            f"{f.request_timeout_s:g} s, and a request is tried up to "
            f"{f.attempts_per_request} times ({PREFIX}request_retries={f.request_retries}; "
            f"{PREFIX}timeouts_in_a_row={f.timeouts_in_a_row} timeouts end it sooner): the "
            f"shard gives up on it after at most {f.longest_wait_s():.0f} s. Said every "
            f"{every:g} s ({PREFIX}waiting_log_every_s); read the server's log"
        )
        print(f"[{self.shard}] {line}", file=sys.stderr, flush=True)
        log_event(self.event_log, f"rollout {self.shard}", line)
        return line
