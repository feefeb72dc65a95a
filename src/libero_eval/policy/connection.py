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

:class:`~libero_eval.policy.endpoint.ConnectionSpec` describes the server's endpoint;
:func:`connect` picks the implementation from it, and :func:`policy_connection_spec` asks the
policy family for it (``Family.endpoint``, ``libero_eval.policy.families``), which derives it
from the server-facing keys of its settings. A connection classifies each of its failures
(``policy/errors.py``) and retries as its :class:`~libero_eval.failures.FailurePolicy` says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from libero_eval.failures import FailurePolicy
from libero_eval.policy import families
from libero_eval.policy.endpoint import CHANNELS, ConnectionSpec
from libero_eval.policy.http_connection import HttpConnection
from libero_eval.policy.ws_connection import WebsocketConnection

__all__ = ["CHANNELS", "ConnectionSpec", "PolicyConnection", "connect", "policy_connection_spec"]


def policy_connection_spec(url: str, family: str, settings: dict[str, Any]) -> ConnectionSpec:
    """The endpoint that ``family``'s settings (``policy.<family>``) talk to at ``url``: the
    family's own (``Family.endpoint``)."""
    return families.connection_spec(url, family, settings)


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
        spec.url,
        failures,
        spec.wire_format,
        health_path=spec.health_path,
        request_path=spec.request_path,
        metadata_path=spec.metadata_path,
        **overrides,
    )
