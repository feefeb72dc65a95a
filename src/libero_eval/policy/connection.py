"""One interface to a policy server, whatever channel (wire protocol) it speaks.

A :class:`PolicyConnection` sends request bodies (built by a family adapter) and returns the
decoded answers; the adapters know nothing of channels. (The *episode* protocol, how an
episode runs, is another thing: ``libero_eval.rollout.protocols``.) Two implementations share
the code in ``policy/connection_base.py`` (URL and loopback checks, ``GET <health path>``
readiness, the retries the failure policy allows):

- :class:`~libero_eval.policy.http_connection.HttpConnection`: SGLang's action API
  (``POST /v1/actions/generations``), msgpack or JSON bodies;
- :class:`~libero_eval.policy.ws_connection.WebsocketConnection`: openpi's websocket protocol
  (one msgpack frame per request), spoken by openpi's ``serve_policy.py`` and SGLang's
  ``/openpi/policy``.

:class:`ConnectionSpec` describes the server's endpoint; :func:`connect` picks the
implementation from it, and :func:`policy_connection_spec` derives it from the policy
settings' server-facing keys (``policy.cosmos3.transport``, ``policy.pi05.api`` and
``policy.pi05.wire_format``). A connection classifies each of its failures
(``policy/errors.py``) and retries as its :class:`~libero_eval.failures.FailurePolicy` says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from libero_eval.failures import FailurePolicy
from libero_eval.policy.adapters.pi05 import DEFAULTS as PI05_DEFAULTS
from libero_eval.policy.connection_base import WIRE_FORMATS
from libero_eval.policy.http_connection import HttpConnection
from libero_eval.policy.ws_connection import WebsocketConnection

CHANNELS = ("http", "websocket")
#: policy.pi05.api -> (channel, websocket path, readiness path)
PI05_API_ENDPOINTS: dict[str, tuple[str, str, str]] = {
    "sglang_http": ("http", "", "/health"),
    "sglang_websocket": ("websocket", "/openpi/policy", "/health"),
    "openpi_websocket": ("websocket", "", "/healthz"),  # openpi's serve_policy.py
}


@dataclass(frozen=True)
class ConnectionSpec:
    """Where a policy server listens and how it talks.

    ``url``: ``http://HOST:PORT``; ``channel``: the wire protocol, ``http`` or ``websocket``
    (not the episode protocol of ``rollout.protocol``); ``wire_format``:
    the body encoding, ``msgpack`` or ``json`` (websocket: msgpack only); ``path``: the
    websocket path; ``health_path``: answered with HTTP 200 once the server is ready.
    """

    url: str
    channel: str = "http"
    wire_format: str = "msgpack"
    path: str = ""
    health_path: str = "/health"

    def __post_init__(self) -> None:
        if self.channel not in CHANNELS:
            raise ValueError(f"policy connection channel {self.channel!r} is not one of {CHANNELS}")
        if self.wire_format not in WIRE_FORMATS:
            raise ValueError(
                f"policy connection wire_format {self.wire_format!r} is not one of "
                f"{WIRE_FORMATS} (set by policy.cosmos3.transport / policy.pi05.wire_format)"
            )
        if self.channel == "websocket" and self.wire_format != "msgpack":
            raise ValueError("a websocket policy server speaks msgpack only (openpi's protocol)")
        if not self.health_path.startswith("/"):
            raise ValueError(f"health path must start with '/', got {self.health_path!r}")

    def at(self, url: str) -> ConnectionSpec:
        """The same endpoint at ``url`` (a job learns its server's URL from the service file)."""
        return replace(self, url=url)


def policy_connection_spec(url: str, family: str, settings: dict[str, Any]) -> ConnectionSpec:
    """The endpoint that ``family``'s settings (``policy.<family>``) talk to at ``url``.

    Cosmos3: SGLang's HTTP action API, ``policy.cosmos3.transport`` msgpack or png_base64
    (JSON).
    π0.5: ``policy.pi05.api`` (see :data:`PI05_API_ENDPOINTS`); ``sglang_http`` sends
    ``policy.pi05.wire_format``. Any other family: SGLang's HTTP action API with msgpack.
    """
    if family == "pi05":
        block = settings.get("pi05", settings) if isinstance(settings, dict) else None
        if not isinstance(block, dict):
            raise ValueError(f"policy.pi05 must be a mapping, got {type(block).__name__}")
        api = block.get("api", PI05_DEFAULTS["api"])
        if api not in PI05_API_ENDPOINTS:
            raise ValueError(
                f"policy.pi05.api must be one of {list(PI05_API_ENDPOINTS)}, got {api!r}"
            )
        channel, path, health_path = PI05_API_ENDPOINTS[api]
        wire = block.get("wire_format", PI05_DEFAULTS["wire_format"])
        return ConnectionSpec(
            url, channel, wire if channel == "http" else "msgpack", path, health_path
        )
    if family != "cosmos3":  # any other family: SGLang's HTTP action API with msgpack
        return ConnectionSpec(url)
    transport = settings.get("transport", "msgpack") if isinstance(settings, dict) else None
    if transport not in ("msgpack", "png_base64"):
        raise ValueError(
            f"policy.cosmos3.transport must be one of ['msgpack', 'png_base64'], got {transport!r}"
        )
    return ConnectionSpec(url, "http", "msgpack" if transport == "msgpack" else "json")


class PolicyConnection(Protocol):
    """A connection to one policy server; one request at a time (one per thread)."""

    base_url: str

    def infer(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send one request body; the decoded answer (retried on transient failures)."""
        ...

    def metadata(self) -> dict[str, Any]:
        """The server's metadata (its policy family, capabilities)."""
        ...

    def max_batch_size(self) -> int:
        """How many observations one request may carry."""
        ...

    def health(self) -> bool:
        """True when the server's readiness path answers 200."""
        ...

    def wait_until_healthy(
        self, deadline_s: float, poll_s: float = 1.0, is_alive: Callable[[], bool] | None = None
    ) -> None:
        """Poll :meth:`health` until true; ``PolicyServerUnavailable`` at the deadline."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> PolicyConnection: ...

    def __exit__(self, *exc_info: object) -> None: ...


def connect(
    spec: ConnectionSpec, failures: FailurePolicy | None = None, **overrides: Any
) -> PolicyConnection:
    """The connection implementation ``spec`` describes, retrying as ``failures`` says (None:
    the schema's ``rollout.failures`` defaults); ``overrides``: ``timeout_s``, ``max_retries``,
    ``retry_backoff_s`` in place of the policy's."""
    if spec.channel == "websocket":
        return WebsocketConnection(
            spec.url, spec.path, failures, health_path=spec.health_path, **overrides
        )
    return HttpConnection(
        spec.url, failures, spec.wire_format, health_path=spec.health_path, **overrides
    )
