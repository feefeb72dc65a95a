"""A slot whose server the user already runs (`server.backend: url`): checked, probed and
announced as a launched server is, never started or stopped.

The serve job (`libero_eval.serve.job`) runs a `UrlSlot` in place of launching a server:

1. **Readiness.** ``GET <url><health path>`` (the family endpoint's: SGLang's ``/health``,
   openpi's ``/healthz``) until it answers 200. A URL that nothing answers (connection
   refused, no such host, no route, no connection within the try) is tried for
   `server.url.connect_timeout_s`: a wrong host or port shows in seconds. A server that
   answers but not 200 (SGLang's ``/health`` is 503 while it loads) is waited for up to
   `server.health_timeout_s`. Each failure names the field (``server.url.urls[k]``), the
   URL, the last answer and the setting to change.
2. **Identity.** Its metadata (the family's endpoint) must show `policy.family`
   (`PolicyAdapter.check_server_metadata`) and, with `server.url.model_id`, name that model
   where it names one: ``model`` (SGLang's ``--served-model-name``, by default its
   ``--model-path``) or ``model_path`` (SGLang 0.5.23
   ``runtime/entrypoints/action/protocol.py`` ``action_metadata`` and each family's own
   metadata function beside it). A mismatch fails the slot naming the URL and what differs.
3. **Capacity**, measured as for a launched server (`libero_eval.policy.capacity`), before
   "ready". The service file's ``timeline`` reads ``launch`` = the check began, ``healthy`` =
   its first 200: the report's "server start → ready" is the check and the probe, with no
   cold start.
4. **"ready"**, then nothing until SIGTERM (Snakemake, once the slot's shards ended):
   "stopped", with the server left running (``left_running`` in the service file).

Proxies: a loopback URL is reached directly; a URL on another host through the environment's
proxy settings where they name one (`libero_eval.service.proxies_apply`), as the shards'
HTTP connections reach it (`libero_eval.policy.connection_base`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

from libero_eval.policy.capacity import CapacityProbe
from libero_eval.policy.errors import PolicyClientError
from libero_eval.serve.events import EventLog, StopRequest, describe_capacity, now_iso, say
from libero_eval.serve.settings import ServerSettings, UrlServerSettings
from libero_eval.serve.startup import describe_parts
from libero_eval.service import proxies_apply, write_service_file

EXIT_STOPPED = 0
EXIT_SERVER_FAILED = 1
HEALTH_TRY_S = 5.0  # the longest one readiness try waits for its answer
# what requests' connection errors say, in words a user acts on (first match wins)
CONNECT_FAILURES = (
    ("Connection refused", "connection refused: nothing listens on that port"),
    ("Name or service not known", "no such host"),
    ("nodename nor servname", "no such host"),
    ("Temporary failure in name resolution", "the host name does not resolve now"),
    ("No route to host", "no route to that host"),
    ("Network is unreachable", "the network is unreachable"),
    ("timed out", "no connection within the try"),
)
# the metadata fields that name a server's model (SGLang 0.5.23, module doc)
MODEL_FIELDS = ("model", "model_path")


class UrlServerError(RuntimeError):
    """A URL server that cannot be used; the message names the field, the URL and the fix."""


def connect_failure(exc: requests.RequestException) -> str:
    """What a failed readiness try says: ``connection refused: nothing listens ...``."""
    text = str(exc)
    for needle, words in CONNECT_FAILURES:
        if needle in text:
            return words
    return type(exc).__name__


def via_proxy(url: str) -> str:
    """`` through the proxy <p> (the environment's ...)`` where one applies to ``url``."""
    if not proxies_apply(url):
        return ""
    proxy = requests.utils.get_environ_proxies(url).get(url.split(":", 1)[0])
    if not proxy:
        return ""
    return (
        f" through the proxy {proxy} (the environment's HTTP_PROXY / HTTPS_PROXY; add the "
        "host to NO_PROXY to reach it directly)"
    )


def served_model(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The metadata's fields that name the model (:data:`MODEL_FIELDS`) that are strings."""
    return {k: metadata[k] for k in MODEL_FIELDS if isinstance(metadata.get(k), str)}


def model_mismatch(metadata: Mapping[str, Any], model_id: str | None) -> str | None:
    """Why the server is not of ``server.url.model_id`` (None: it is, no model_id is given, or
    the metadata names no model)."""
    reported = served_model(metadata)
    if model_id is None or not reported or model_id in reported.values():
        return None
    named = ", ".join(f"{k} {v!r}" for k, v in reported.items())
    return (
        f"server.url.model_id is {model_id!r} but the server's metadata names {named}: set "
        "server.url.model_id to the model it serves, or point the slot at the server of "
        f"{model_id!r}"
    )


class UrlSlot:
    """One slot's server that the user runs: checked, probed, announced, left running."""

    def __init__(
        self,
        settings: ServerSettings,
        service_file: Any,
        events: EventLog,
        probe: Callable[..., dict[str, Any]] | None = None,
    ):
        assert settings.url is not None, "a URL slot needs server.url (backend url)"
        self.settings = settings
        self.server: UrlServerSettings = settings.url
        self.probe = probe
        self.service_file = service_file
        self.events = events
        self.info: dict[str, Any] = {
            "slot": settings.slot,
            "url": self.server.url,
            "source": self.server.source,
            "backend": "url",
            "health_path": self.server.health_path,
            "pid": None,
            "pgid": None,
            "launcher_pid": os.getpid(),
            "started_at": now_iso(),
            "status": "starting",
            "timeline": {"launch": None, "healthy": None, "probe_done": None, "ready": None},
        }

    @property
    def health_url(self) -> str:
        return self.server.url + self.server.health_path

    def publish(self, status: str, **extra: Any) -> None:
        self.info.update(status=status, **extra)
        write_service_file(self.service_file, self.info)

    def fail(self, message: str) -> int:
        say(message, error=True)
        self.publish("failed", error=message, stopped_at=now_iso())
        self.events.write(f"server failed: {message}")
        return EXIT_SERVER_FAILED

    def wait_ready(self, stop: StopRequest) -> float | None:
        """Seconds until ``<url><health path>`` answered 200 (module doc, 1); None when a stop
        came first. Raises :class:`UrlServerError`."""
        started = time.monotonic()
        answered, last = False, "no answer yet"
        with requests.Session() as session:
            session.trust_env = proxies_apply(self.server.url)
            while not stop.is_set():
                try:
                    response = session.get(self.health_url, timeout=HEALTH_TRY_S)
                    if response.status_code == 200:
                        return time.monotonic() - started
                    answered, last = True, f"HTTP {response.status_code}"
                except requests.exceptions.ReadTimeout:
                    answered, last = True, f"no answer within {HEALTH_TRY_S:g} s"
                except requests.RequestException as exc:
                    last = connect_failure(exc)
                elapsed = time.monotonic() - started
                limit = (
                    self.settings.health_timeout_s if answered else self.server.connect_timeout_s
                )
                if elapsed >= limit:
                    raise UrlServerError(self.not_ready(answered, last, elapsed))
                stop.wait(min(self.settings.health_poll_s, limit - elapsed))
        return None

    def not_ready(self, answered: bool, last: str, elapsed: float) -> str:
        where = f"{self.server.source} {self.server.url}"
        if not answered:
            return (
                f"{where}: nothing answers at {self.health_url}{via_proxy(self.server.url)} "
                f"({last}) after {elapsed:.1f} s (server.url.connect_timeout_s="
                f"{self.server.connect_timeout_s:g}). Check the host and port, and that the "
                "server runs there; if it binds its port only once loaded, raise "
                "server.url.connect_timeout_s"
            )
        return (
            f"{where}: {self.health_url} answered {last}, not 200, for {elapsed:.1f} s "
            f"(server.health_timeout_s={self.settings.health_timeout_s:g}): the server is up "
            "but not ready. Read its own log; raise server.health_timeout_s if it is still "
            "loading"
        )

    def check_identity(self) -> None:
        """The server's metadata against `policy.family` and `server.url.model_id` (module
        doc, 2); raises :class:`UrlServerError` naming the URL and what differs."""
        where = f"{self.server.source} {self.server.url}"
        if not isinstance(self.probe, CapacityProbe):
            say(f"{where}: no --capacity-probe, so its family is checked by the shards only")
            return
        try:
            with self.probe.connect(self.server.url) as connection:
                metadata = connection.metadata()
            self.probe.adapter().check_server_metadata(metadata)
        except (PolicyClientError, ValueError) as exc:
            raise UrlServerError(f"{where}: refused: {exc}") from exc
        mismatch = model_mismatch(metadata, self.server.model_id)
        if mismatch:
            raise UrlServerError(f"{where}: refused: {mismatch}")
        family = metadata.get("policy_family", self.probe.family)
        reported = served_model(metadata)
        self.info["served_model"] = {"policy_family": family, **reported}
        named = ", ".join(f"{k} {v!r}" for k, v in reported.items()) or "no model name"
        self.events.write(f"server checked: {self.server.url} serves {family} ({named})")

    def measure(self) -> float | None:
        """The capacity probe (a warning when it fails); its seconds, None without one."""
        if self.probe is None:
            return None
        started = time.monotonic()
        try:
            self.info["capacity"] = capacity = self.probe(self.server.url, captured=None)
        except Exception as exc:  # noqa: BLE001 - a probe never fails the server
            message = f"capacity probe failed after {time.monotonic() - started:.1f} s: {exc!r}"
            say(f"warning: {message}", error=True)
            self.events.write(f"warning: {message}")
            return time.monotonic() - started
        self.events.write(describe_capacity(capacity))
        return time.monotonic() - started

    def run(self, stop: StopRequest) -> int:
        server = self.server
        self.events.write(
            f"server url: {server.url} ({server.source}: a server you run, checked and "
            "probed, never started or stopped)"
        )
        timeline = self.info["timeline"]
        timeline["launch"] = time.time()
        self.publish("starting")
        say(f"slot {self.settings.slot}: checking {self.health_url} ({server.source})")
        try:
            healthy_s = self.wait_ready(stop)
            if healthy_s is None:
                return self.stopped(stop.reason or "stop requested")
            timeline["healthy"] = time.time()
            self.check_identity()
        except UrlServerError as exc:
            return self.fail(str(exc))
        probe_s = self.measure()
        if probe_s is not None:
            timeline["probe_done"] = time.time()
        if stop.is_set():
            return self.stopped(stop.reason or "stop requested")
        parts = {"health": round(healthy_s, 1)}
        if probe_s is not None:
            parts["probe"] = round(probe_s, 1)
        self.info["startup_parts"] = parts
        total = (timeline["probe_done"] or timeline["healthy"]) - timeline["launch"]
        self.events.write(
            f"server start: {total:.1f} s to ready ({healthy_s:.1f} s to healthy; no cold "
            f"start, a server you run): {describe_parts(parts)}"
        )
        self.events.write(f"server ready: {server.url} ({healthy_s:.1f} s)")
        timeline["ready"] = time.time()
        self.publish("ready", ready_at=now_iso(), startup_s=round(healthy_s, 1))
        say(f"slot {self.settings.slot}: ready at {server.url} after {healthy_s:.1f} s")
        stop.wait()
        return self.stopped(stop.reason or "stop requested")

    def stopped(self, reason: str) -> int:
        say(f"stopping: {reason}; {self.server.url} is left running (not ours to stop)")
        self.publish("stopped", error=f"stopped: {reason}", stopped_at=now_iso(), left_running=True)
        self.events.write(
            f"server left running: {self.server.url} ({reason}; server.backend url: the "
            "workflow never stops a server it did not start)"
        )
        return EXIT_STOPPED
