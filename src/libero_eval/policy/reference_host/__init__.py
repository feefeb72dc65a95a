"""The reference server as a family's part of it sees it (docs/rfcs/0009-family-plug-ins.md).

The CPU reference server (``libero_eval.reference``) is the same for every family: the process
and its settings, ``/health`` and ``/v1/stats``, the server policy (``hold``, the scripted
expert) that answers each observation with a LIBERO action chunk, and the batch slot that
stands in for a GPU (one batch at a time, with the latency model). What a family speaks on the
wire is its own: its package names a module (``Family.reference``,
:class:`~libero_eval.policy.families.ReferencePart`) that the server imports when it serves
that family, and that defines

- ``Settings``: a dataclass of the fields the family adds to ``server.reference`` (its
  ``ReferencePart.schema``; none is fine), which the server builds from the family's values
  against the schema, defaults filled in;
- ``add_routes(app, host, settings)``: its routes on the server's FastAPI app (request
  parsing, image checks, answers, metadata), each answering through ``host``, a
  :class:`ReferenceHost`.

Such a module imports nothing of ``libero_eval.reference``: this package is all it knows of the
server (its ``http`` module: the HTTP forms routes share; ``image_check``: the raw camera
frames a request may carry, compared with the family's own preprocessing of them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class PolicyItem:
    """One observation of a request, as a family's part parsed it, for the server policy."""

    image: np.ndarray  # uint8 [H, W, 3], exactly the pixels the client sent
    prompt: str
    privileged_state: dict[str, Any] | None = None  # input.privileged_state[i]; ours only
    seed: int | None = None  # the request's seed, where its API has one (SGLang's default 42)


class RequestError(ValueError):
    """A request the server refuses as the client's fault (HTTP 400; an error frame and a
    close on a websocket); the message says what is wrong and how to fix it."""


class PolicyOutputError(RuntimeError):
    """The server policy returned something other than one finite [H, 7] chunk per item."""


class ReferenceHost(Protocol):
    """What the reference server hands a family's routes."""

    @property
    def policy(self) -> str:
        """The server policy's name (``server.reference.policy``)."""

    @property
    def model_name(self) -> str:
        """The model name the server reports (``reference-<policy>`` by default)."""

    @property
    def max_batch_size(self) -> int:
        """The largest batch the server computes at once (``server.reference.max_batch_size``)."""

    def not_ready(self) -> str | None:
        """Why the server policy cannot answer yet (still building, or its build failed);
        None once it can."""

    def reject(self, reason: str) -> None:
        """Count (``/v1/stats``: ``rejected``) and log a request refused as the client's fault."""

    def act(self, items: list[PolicyItem], action_horizon: int) -> list[np.ndarray]:
        """The server policy's LIBERO chunks, one finite ``float64[action_horizon, 7]`` per
        item (``[dx, dy, dz, ax, ay, az, gripper]``); :class:`PolicyOutputError` otherwise.
        Blocking: call it inside ``compute`` of :meth:`run_batch` or :meth:`run_merged`."""

    async def run_batch(self, request_id: str, compute: Callable[[], Any], items: int) -> Any:
        """``compute()`` as one batch of ``items`` observations of its own, after the batches
        queued before it, taking at least the modelled latency; its value (logged with the
        batch's latency and queueing)."""

    async def run_merged(self, request_id: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` for a one-observation request, merged with the requests waiting into
        one batch of at most ``max_batch_size``, as SGLang's dynamic batching merges them; its
        value."""


__all__ = ["PolicyItem", "PolicyOutputError", "ReferenceHost", "RequestError"]
