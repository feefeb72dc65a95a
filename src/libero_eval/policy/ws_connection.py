"""Websocket policy connection: openpi's protocol (msgpack with numpy arrays, a frame a request).

The protocol of ``openpi_client.websocket_client_policy`` and openpi's
``serving/websocket_policy_server.py``, which SGLang 0.5.23 also speaks at ``/openpi/policy``
(``entrypoints/action/ws_utils.py``): on connect the server sends its metadata as one msgpack
frame; then each request is one msgpack frame and its answer one msgpack frame. A failing
server sends the traceback (openpi: a text frame; SGLang: ``{"error": traceback}``) and closes
the connection with code 1011.

The numpy encoding is SGLang's and openpi's (``libero_eval.policy.codec``), byte-identical.
We use the ``websockets`` package directly rather than ``openpi-client``: openpi-client 0.1.2
pins ``numpy<2`` while LIBERO's stack here needs numpy 2, and this client adds what the
workflow needs (timeouts, reconnect-and-retry, readiness, errors that name the fix).

Failures are classified once (``libero_eval.failures``): an error frame is a rejected request
(the server failed on THIS request; SGLang and openpi send one for a bad request and for a bug
alike), as is a close saying the request is bad (1003 unsupported data, 1007 invalid payload,
1008 policy violation, 1009 too big); a timeout, a failed connect, and a connection closed
before the answer with any other code (1011 internal error, 1012 service restart, 1013 try
again later, 1001 going away, 1006 gone without a close frame) are transient and retried on a
fresh connection; an undecodable frame is a bad answer.

One connection serves one request at a time: use one per thread, as with
:class:`~libero_eval.policy.http_connection.HttpConnection`; both implement
:class:`~libero_eval.policy.connection.PolicyConnection`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Unpack
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from libero_eval.failures import FailurePolicy
from libero_eval.policy import codec
from libero_eval.policy.connection_base import ConnectionBase, ConnectionOptions
from libero_eval.policy.errors import (
    PolicyClientError,
    PolicyRequestRejected,
    PolicyResponseError,
    TransientFailure,
)

# close codes (RFC 6455 7.4.1) that say the request itself is bad: retrying it cannot help
REJECTING_CLOSE_CODES = {
    1003: "unsupported data",
    1007: "invalid payload data",
    1008: "policy violation",
    1009: "message too big",
}


class WebsocketConnection(ConnectionBase):
    """Talks to one websocket policy server at ``base_url`` (``http://HOST:PORT``) + ``path``.

    :meth:`infer` sends one request and returns the decoded answer. Connection failures,
    timeouts and connections closed before an answer (also with 1011 internal error) are
    retried on a fresh connection as ``failures`` (``rollout.failures``) says; an error frame
    from the server, or a close saying the request is bad, is not retried (the server rejected
    this request) and raises :class:`PolicyRequestRejected`. ``options``: overrides of
    ``failures`` and the rest of :class:`~libero_eval.policy.connection_base.ConnectionOptions`.
    """

    def __init__(
        self,
        base_url: str,
        path: str = "",
        failures: FailurePolicy | None = None,
        health_path: str = "/health",
        **options: Unpack[ConnectionOptions],
    ):
        super().__init__(base_url, failures, health_path, ("http", "https", "ws", "wss"), **options)
        parts = urlsplit(base_url)
        http_scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        ws_scheme = "wss" if http_scheme == "https" else "ws"
        self.base_url = urlunsplit((http_scheme, parts.netloc, "", "", "")).rstrip("/")
        self.ws_url = urlunsplit((ws_scheme, parts.netloc, path or "/", "", ""))
        self.server_metadata: dict[str, Any] | None = None
        self._ws: ClientConnection | None = None

    # ---------------------------------------------------------------- connection

    def _connect(self) -> ClientConnection:
        if self._ws is None:
            ws = connect(
                self.ws_url,
                open_timeout=min(self.timeout_s, 30.0),
                close_timeout=2,
                compression=None,
                max_size=None,
                proxy=None,
            ).__enter__()  # a long-lived connection, closed by _drop()
            try:
                self.server_metadata = self._decode(ws.recv(timeout=self.timeout_s), "metadata")
            except BaseException:
                ws.close()
                raise
            self._ws = ws
        return self._ws

    def _drop(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):  # the connection may already be broken
                self._ws.close()
            self._ws = None

    def close(self) -> None:
        self._drop()
        super().close()

    def _decode(self, frame: bytes | str, what: str) -> dict[str, Any]:
        if isinstance(frame, str):  # openpi's server sends its traceback as a text frame
            raise PolicyRequestRejected(
                f"websocket policy server {self.ws_url} failed on the request (its {what} was "
                f"an error): {frame[-2000:]}",
                status=None,
                detail=frame,
            )
        try:
            decoded = codec.unpack(frame)
        except ValueError as exc:
            raise PolicyResponseError(
                f"websocket policy server {self.ws_url} sent an undecodable {what} frame "
                f"({exc}); is it a policy server speaking openpi's msgpack protocol?"
            ) from exc
        if not isinstance(decoded, dict):
            raise PolicyResponseError(
                f"websocket policy server {self.ws_url} sent a {type(decoded).__name__} as "
                f"its {what}, expected a map"
            )
        if what == "answer" and set(decoded) == {"error"}:
            raise PolicyRequestRejected(
                f"websocket policy server {self.ws_url} failed on the request: "
                f"{str(decoded['error'])[-2000:]}",
                status=None,
                detail=decoded["error"],
            )
        return decoded

    # ---------------------------------------------------------------- metadata

    def metadata(self) -> dict[str, Any]:
        """The metadata frame the server sends on connect."""
        self._exchange(self._connect)
        assert self.server_metadata is not None
        return self.server_metadata

    def max_batch_size(self) -> int:
        """Always 1: one observation per frame (openpi's protocol)."""
        return 1

    # ---------------------------------------------------------------- generation

    def infer(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send ``payload`` as one msgpack frame and return the decoded answer."""
        try:
            frame = codec.pack(payload)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"policy request for {self.ws_url} cannot be encoded: {exc}") from exc

        def exchange() -> dict[str, Any]:
            ws = self._connect()
            ws.send(frame)
            return self._decode(ws.recv(timeout=self.timeout_s), "answer")

        return self._exchange(exchange)

    def _exchange(self, attempt_once: Callable[[], Any]) -> Any:
        def attempt() -> Any:
            try:
                return attempt_once()
            except PolicyClientError:
                raise  # classified already (an error frame, an undecodable frame)
            except TimeoutError as exc:
                raise TransientFailure(
                    f"no answer within {self.timeout_s:g} s ({self.timeout_setting})",
                    timed_out=True,
                ) from exc
            except ConnectionClosed as exc:
                raise self._closed(exc) from exc
            except (OSError, InvalidHandshake, InvalidURI) as exc:
                raise TransientFailure(f"connection failed: {exc}") from exc

        def failed(attempts: int, last_error: str) -> str:
            return (
                f"websocket {self.ws_url} failed after {attempts} attempt(s) "
                f"(rollout.failures.request_retries={self.failures.request_retries}); last "
                f"error: {last_error}. Check that the "
                "policy server is up (its log) and that policy.pi05.api matches it"
            )

        # every failure drops the connection: the server closes it after an error frame, and
        # a retry starts on a fresh one
        return self._with_retries(attempt, failed, on_failure=self._drop)

    def _closed(self, exc: ConnectionClosed) -> PolicyClientError:
        """A connection closed before the answer, classified by its close code."""
        close = exc.rcvd
        if close is not None and close.code in REJECTING_CLOSE_CODES:
            return PolicyRequestRejected(
                f"websocket policy server {self.ws_url} closed the connection with code "
                f"{close.code} ({REJECTING_CLOSE_CODES[close.code]}): {close.reason}. The request "
                "is invalid for this server; fix the policy settings (not retried)",
                status=close.code,
                detail=close.reason,
            )
        told = f"code {close.code}: {close.reason}" if close is not None else "no close frame"
        return TransientFailure(f"connection closed before the answer ({told})")
