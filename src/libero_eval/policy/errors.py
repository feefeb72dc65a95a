"""The errors a policy connection raises (HTTP and websocket alike)."""

from __future__ import annotations

from typing import Any


class PolicyClientError(RuntimeError):
    """Base class of the policy connection's errors."""


class PolicyServerUnavailable(PolicyClientError):
    """The server did not answer (connection refused, timeout, 5xx) within the allowed tries."""


class PolicyRequestRejected(PolicyClientError):
    """The server rejected the request (HTTP 4xx, websocket error frame); retrying cannot help."""

    def __init__(self, message: str, status: int, detail: Any):
        super().__init__(message)
        self.status = status
        self.detail = detail


class PolicyResponseError(PolicyClientError):
    """The server answered with a body that cannot be decoded or is not a valid action."""
