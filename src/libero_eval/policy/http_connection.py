"""HTTP connection to SGLang's action API (``/health``, ``/v1/actions/metadata``,
``/v1/actions/generations``): every failure classified once (connection refused or reset,
timeout, 5xx: transient; 4xx: rejected; an undecodable or non-object body: bad answer), the
failure policy's retries, and clear errors.

:meth:`HttpConnection.infer` returns the decoded response body; the wall time of the
successful HTTP attempt (send, server work, receive, decode) is left in
``last_latency_s`` and the number of attempts it took in ``last_attempts``
(:class:`~libero_eval.policy.connection_base.ConnectionBase`). One connection per thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Unpack

import numpy as np
import requests

from libero_eval.failures import FailurePolicy
from libero_eval.policy import codec
from libero_eval.policy.connection_base import WIRE_FORMATS, ConnectionBase, ConnectionOptions
from libero_eval.policy.endpoint import GENERATIONS_PATH, METADATA_PATH
from libero_eval.policy.errors import (
    PolicyClientError,
    PolicyRequestRejected,
    PolicyResponseError,
    PolicyServerUnavailable,
    TransientFailure,
)

HEALTH_PATH = "/health"
MSGPACK_CONTENT_TYPE = "application/msgpack"

__all__ = [
    "HttpConnection",
    "PolicyClientError",
    "PolicyRequestRejected",
    "PolicyResponseError",
    "PolicyServerUnavailable",
]


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"object of type {type(value).__name__} is not JSON serializable")


def _error_detail(response: requests.Response) -> Any:
    """The server's ``detail`` (FastAPI error body) or the body text."""
    body: Any = None
    try:
        body = response.json()
    except ValueError:
        if "msgpack" in response.headers.get("content-type", ""):
            try:
                body = codec.unpack(response.content)
            except Exception:
                body = None
    if isinstance(body, dict) and "detail" in body:
        return body["detail"]
    if body is not None:
        return body
    return response.text[:2000]


class HttpConnection(ConnectionBase):
    """Talks to one policy server at ``base_url`` (e.g. ``http://127.0.0.1:30000``).

    ``wire_format``: ``"msgpack"`` sends ``application/msgpack`` bodies with numpy arrays as
    raw bytes (SGLang's ndarray encoding) and asks for msgpack back; ``"json"`` sends and
    receives JSON, numpy arrays converted to lists. :meth:`infer` retries connection errors,
    timeouts and 5xx as ``failures`` (``rollout.failures``) says; 4xx is never retried.
    ``options``: overrides of ``failures`` and the rest of :class:`ConnectionOptions`.
    """

    def __init__(
        self,
        base_url: str,
        failures: FailurePolicy | None = None,
        wire_format: str = "msgpack",
        *,
        health_path: str = HEALTH_PATH,
        request_path: str = GENERATIONS_PATH,
        metadata_path: str | None = METADATA_PATH,
        **options: Unpack[ConnectionOptions],
    ):
        super().__init__(base_url, failures, health_path, **options)
        if wire_format not in WIRE_FORMATS:
            raise ValueError(
                f"policy client wire_format {wire_format!r} is not one of {WIRE_FORMATS} "
                "(set by the family's settings under policy.<family>)"
            )
        self.base_url = base_url.rstrip("/")
        self.wire_format = wire_format
        # the family's endpoint (ConnectionSpec): SGLang's action API unless it has its own
        self.request_path = request_path
        self.metadata_path = metadata_path

    def _url(self, path: str) -> str:
        return self.base_url + path

    # ---------------------------------------------------------------- metadata

    def metadata(self) -> dict[str, Any]:
        """``GET <metadata path>`` (``/v1/actions/metadata``) as a dict (retried like
        :meth:`infer`); empty for a server without metadata (its endpoint has no path)."""
        path = self.metadata_path
        if path is None:
            return {}
        return self._request(
            "GET",
            path,
            lambda: self._session.get(
                self._url(path), timeout=self.timeout_s, proxies=self._proxies
            ),
        )

    def max_batch_size(self) -> int:
        """``capabilities.max_batch_size`` from the metadata (1 when absent)."""
        metadata = self.metadata()
        capabilities = metadata.get("capabilities") or {}
        value = capabilities.get("max_batch_size", 1) if isinstance(capabilities, dict) else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyResponseError(
                f"{self._url(self.metadata_path or '')}: capabilities.max_batch_size must be an "
                f"int >= 1, got {value!r}"
            )
        return value

    # ---------------------------------------------------------------- generation

    def encode(self, payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        """Request body and headers for ``payload`` in this connection's wire format."""
        if self.wire_format == "msgpack":
            return codec.pack(payload), {
                "Content-Type": MSGPACK_CONTENT_TYPE,
                "Accept": MSGPACK_CONTENT_TYPE,
            }
        body = json.dumps(payload, default=_json_default, allow_nan=False).encode("utf-8")
        return body, {"Content-Type": "application/json", "Accept": "application/json"}

    def infer(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST <request path>`` (``/v1/actions/generations``) with ``payload``; returns the
        decoded response.

        Raises :class:`PolicyRequestRejected` (4xx, with the server's ``detail``),
        :class:`PolicyServerUnavailable` (retries exhausted) or :class:`PolicyResponseError`
        (a 2xx body that does not decode to a dict).
        """
        try:
            body, headers = self.encode(payload)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"policy request for {self._url(self.request_path)} cannot be encoded as "
                f"{self.wire_format}: {exc}"
            ) from exc
        return self._request(
            "POST",
            self.request_path,
            lambda: self._session.post(
                self._url(self.request_path),
                data=body,
                headers=headers,
                timeout=self.timeout_s,
                proxies=self._proxies,
            ),
        )

    def _request(
        self, method: str, path: str, send: Callable[[], requests.Response]
    ) -> dict[str, Any]:
        url = self._url(path)

        def attempt() -> dict[str, Any]:
            try:
                response = send()
            except requests.Timeout as exc:
                raise TransientFailure(
                    f"timed out after {self.timeout_s:g} s ({self.timeout_setting}; "
                    f"{type(exc).__name__})",
                    timed_out=True,
                ) from exc
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
                raise TransientFailure(f"connection failed: {exc}") from exc
            return self._check_response(method, url, response)

        def failed(attempts: int, last_error: str) -> str:
            return (
                f"{method} {url} failed after {attempts} attempt(s) "
                f"(rollout.failures.request_retries={self.failures.request_retries}, linear "
                f"backoff {self.failures.retry_backoff_s:g} s); "
                f"last error: {last_error}. Check that the policy server is up and its log"
            )

        return self._with_retries(attempt, failed)

    def _check_response(self, method: str, url: str, response: requests.Response) -> dict:
        status = response.status_code
        if status >= 500:
            raise TransientFailure(f"HTTP {status}: {_error_detail(response)!r}"[:2000])
        if 400 <= status < 500:
            detail = _error_detail(response)
            raise PolicyRequestRejected(
                f"{method} {url} was rejected with HTTP {status}: {detail}. The request is "
                "invalid for this server; fix the policy settings (not retried)",
                status=status,
                detail=detail,
            )
        if status != 200:
            raise PolicyResponseError(f"{method} {url} answered unexpected HTTP {status}")
        content_type = response.headers.get("content-type", "").lower()
        try:
            if "msgpack" in content_type:
                decoded = codec.unpack(response.content)
            else:
                decoded = response.json()
        except Exception as exc:
            raise PolicyResponseError(
                f"{method} {url} answered HTTP 200 with an undecodable "
                f"{content_type or 'untyped'} body ({type(exc).__name__}: {exc}); "
                f"first bytes: {response.content[:80]!r}"
            ) from exc
        if not isinstance(decoded, dict):
            raise PolicyResponseError(
                f"{method} {url} answered HTTP 200 with a {type(decoded).__name__}, "
                "expected an object"
            )
        return decoded
