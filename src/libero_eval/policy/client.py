"""HTTP client for SGLang's action API (``/health``, ``/v1/actions/metadata``,
``/v1/actions/generations``): timeouts, linear-backoff retries and clear errors.

Latency: :meth:`PolicyClient.generate` returns the decoded response body; the wall time of the
successful HTTP attempt (send, server work, receive, decode) is left in
``client.last_latency_s`` and the number of attempts it took in ``client.last_attempts``. They
describe the latest call of this instance, so use one client per thread.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import requests

from libero_eval.policy import codec

GENERATIONS_PATH = "/v1/actions/generations"
METADATA_PATH = "/v1/actions/metadata"
HEALTH_PATH = "/health"
MSGPACK_CONTENT_TYPE = "application/msgpack"
TRANSPORTS = ("msgpack", "json", "png_base64")


class PolicyClientError(RuntimeError):
    """Base class of the policy client's errors."""


class PolicyServerUnavailable(PolicyClientError):
    """The server did not answer (connection refused, timeout, 5xx) within the allowed tries."""


class PolicyRequestRejected(PolicyClientError):
    """The server rejected the request with a 4xx status; retrying cannot help."""

    def __init__(self, message: str, status: int, detail: Any):
        super().__init__(message)
        self.status = status
        self.detail = detail


class PolicyResponseError(PolicyClientError):
    """The server answered 2xx with a body that cannot be decoded or is not a valid action."""


class _RetryableFailure(Exception):
    """One attempt failed in a way worth retrying."""


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


class PolicyClient:
    """Talks to one policy server at ``base_url`` (e.g. ``http://127.0.0.1:30000``).

    ``transport``: ``"msgpack"`` sends ``application/msgpack`` bodies with numpy arrays as raw
    bytes (SGLang's ndarray encoding) and asks for msgpack back; ``"json"`` (alias
    ``"png_base64"``) sends and receives JSON, numpy arrays converted to lists.
    ``generate`` retries connection errors, timeouts and 5xx ``max_retries`` times, sleeping
    ``k * retry_backoff_s`` before retry ``k``; 4xx is never retried. Proxies from the
    environment are ignored for loopback URLs (a cluster's ``http_proxy`` must not capture
    ``127.0.0.1``) and honoured otherwise.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 600,
        max_retries: int = 5,
        retry_backoff_s: float = 1.0,
        transport: str = "msgpack",
        *,
        sleep: Callable[[float], None] = time.sleep,
    ):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"policy server URL {base_url!r} must look like http://HOST:PORT "
                "(check policy.url / the server slot's host and port)"
            )
        if not timeout_s > 0:
            raise ValueError(f"policy client timeout_s must be > 0, got {timeout_s}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"policy client max_retries must be an int >= 0, got {max_retries}")
        if not retry_backoff_s >= 0:
            raise ValueError(f"policy client retry_backoff_s must be >= 0, got {retry_backoff_s}")
        if transport not in TRANSPORTS:
            raise ValueError(f"policy client transport {transport!r} is not one of {TRANSPORTS}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.retry_backoff_s = float(retry_backoff_s)
        self.transport = "json" if transport == "png_base64" else transport
        self.last_latency_s: float | None = None
        self.last_attempts: int = 0
        self._sleep = sleep
        self._session = requests.Session()
        if _is_loopback(parts.hostname):
            self._session.trust_env = False
            self._proxies: dict[str, str | None] | None = {"http": None, "https": None}
        else:
            self._proxies = None

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _url(self, path: str) -> str:
        return self.base_url + path

    # ---------------------------------------------------------------- readiness and metadata

    def health(self) -> bool:
        """True when ``GET /health`` answers 200 within a few seconds."""
        try:
            response = self._session.get(
                self._url(HEALTH_PATH), timeout=min(self.timeout_s, 5.0), proxies=self._proxies
            )
        except requests.RequestException:
            return False
        return response.status_code == 200

    def wait_until_healthy(
        self,
        deadline_s: float,
        poll_s: float = 1.0,
        is_alive: Callable[[], bool] | None = None,
    ) -> None:
        """Poll ``/health`` until it answers 200, for at most ``deadline_s`` seconds from now.

        Raises :class:`PolicyServerUnavailable` at the deadline, or as soon as ``is_alive()``
        returns False (e.g. the server process exited).
        """
        start = time.monotonic()
        while True:
            if self.health():
                return
            if is_alive is not None and not is_alive():
                raise PolicyServerUnavailable(
                    f"policy server {self.base_url} exited before {HEALTH_PATH} answered 200 "
                    f"(waited {time.monotonic() - start:.1f} s); read the server log"
                )
            elapsed = time.monotonic() - start
            if elapsed >= deadline_s:
                raise PolicyServerUnavailable(
                    f"policy server {self.base_url}{HEALTH_PATH} did not answer 200 within "
                    f"{deadline_s:g} s; check the server log, or raise the readiness deadline "
                    "if model loading is slow"
                )
            time.sleep(max(0.0, min(poll_s, deadline_s - elapsed)))

    def metadata(self) -> dict[str, Any]:
        """``GET /v1/actions/metadata`` as a dict (retried like :meth:`generate`)."""
        body = self._with_retries(
            "GET",
            METADATA_PATH,
            lambda: self._session.get(
                self._url(METADATA_PATH), timeout=self.timeout_s, proxies=self._proxies
            ),
        )
        return body

    def max_batch_size(self) -> int:
        """``capabilities.max_batch_size`` from the metadata (1 when absent)."""
        metadata = self.metadata()
        capabilities = metadata.get("capabilities") or {}
        value = capabilities.get("max_batch_size", 1) if isinstance(capabilities, dict) else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyResponseError(
                f"{self._url(METADATA_PATH)}: capabilities.max_batch_size must be an int >= 1, "
                f"got {value!r}"
            )
        return value

    # ---------------------------------------------------------------- generation

    def encode(self, payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        """Request body and headers for ``payload`` in this client's transport."""
        if self.transport == "msgpack":
            return codec.pack(payload), {
                "Content-Type": MSGPACK_CONTENT_TYPE,
                "Accept": MSGPACK_CONTENT_TYPE,
            }
        body = json.dumps(payload, default=_json_default, allow_nan=False).encode("utf-8")
        return body, {"Content-Type": "application/json", "Accept": "application/json"}

    def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/actions/generations`` with ``payload``; returns the decoded response.

        Raises :class:`PolicyRequestRejected` (4xx, with the server's ``detail``),
        :class:`PolicyServerUnavailable` (retries exhausted) or :class:`PolicyResponseError`
        (a 2xx body that does not decode to a dict).
        """
        try:
            body, headers = self.encode(payload)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"policy request for {self._url(GENERATIONS_PATH)} cannot be encoded as "
                f"{self.transport}: {exc}"
            ) from exc
        return self._with_retries(
            "POST",
            GENERATIONS_PATH,
            lambda: self._session.post(
                self._url(GENERATIONS_PATH),
                data=body,
                headers=headers,
                timeout=self.timeout_s,
                proxies=self._proxies,
            ),
        )

    def _with_retries(
        self, method: str, path: str, send: Callable[[], requests.Response]
    ) -> dict[str, Any]:
        url = self._url(path)
        last_error = ""
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            started = time.monotonic()
            try:
                response = send()
                body = self._check_response(method, url, response)
            except _RetryableFailure as failure:
                last_error = str(failure)
            except requests.Timeout as exc:
                last_error = f"timed out after {self.timeout_s:g} s ({type(exc).__name__})"
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
                last_error = f"connection failed: {exc}"
            else:
                self.last_latency_s = time.monotonic() - started
                self.last_attempts = attempt
                return body
            if attempt < attempts:
                self._sleep(attempt * self.retry_backoff_s)
        self.last_attempts = attempts
        raise PolicyServerUnavailable(
            f"{method} {url} failed after {attempts} attempt(s) "
            f"(max_retries={self.max_retries}, linear backoff {self.retry_backoff_s:g} s); "
            f"last error: {last_error}. Check that the policy server is up and its log"
        )

    def _check_response(self, method: str, url: str, response: requests.Response) -> dict:
        status = response.status_code
        if status >= 500:
            raise _RetryableFailure(f"HTTP {status}: {_error_detail(response)!r}"[:2000])
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
