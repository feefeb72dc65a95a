"""The errors a policy connection raises (HTTP and websocket alike), each of one
:class:`~libero_eval.failures.FailureKind`: a connection classifies a failure once, by the
error it raises, and :class:`~libero_eval.failures.FailurePolicy` decides what follows."""

from __future__ import annotations

from typing import Any

from libero_eval.failures import FailureKind


class PolicyClientError(RuntimeError):
    """Base class of the policy connection's errors; ``kind`` is what the failure says."""

    kind: FailureKind


class TransientFailure(PolicyClientError):
    """One try of a request failed in a way the same request may not fail again: connection
    refused or reset, a timeout, HTTP 5xx, a websocket closed before the answer (1011
    internal error included). The connection retries it as its failure policy says."""

    kind = FailureKind.TRANSIENT

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out  # no answer within the timeout (rather than a refusal)


class PolicyServerUnavailable(PolicyClientError):
    """Transient failures until the failure policy gave up (``attempts`` tries), or a server
    that never became ready or answers nothing: the server is gone. The connection asked the
    failure policy about every try; whoever gets this fails the shard."""

    kind = FailureKind.TRANSIENT

    def __init__(self, message: str, attempts: int | None = None):
        super().__init__(message)
        self.attempts = attempts


class PolicyRequestRejected(PolicyClientError):
    """The server rejected the request (HTTP 4xx, a websocket error frame, or a close saying
    the request is bad); retrying cannot help. ``status``: the HTTP status or websocket close
    code (None for an error frame)."""

    kind = FailureKind.REJECTED

    def __init__(self, message: str, status: int | None, detail: Any):
        super().__init__(message)
        self.status = status
        self.detail = detail


class PolicyResponseError(PolicyClientError):
    """The server answered with a body that cannot be decoded or is not a valid action."""

    kind = FailureKind.BAD_ANSWER
