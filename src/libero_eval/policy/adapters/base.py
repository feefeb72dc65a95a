"""The interface every model-family adapter implements: observations -> request body,
response body -> LIBERO actions. A new SGLang action policy family is one new module."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np


@dataclass
class Observation:
    """One env's observation at a policy query."""

    agentview: np.ndarray  # uint8 [H, W, 3] exactly as LIBERO renders it (upside down)
    wrist: np.ndarray  # uint8 [H, W, 3], same orientation
    task_language: str
    privileged_state: dict[str, Any] | None = None  # only with rollout.send_privileged_state


class PolicyAdapter(ABC):
    """Translate between LIBERO observations/actions and one model family's request format.

    Adapters are pure: no HTTP. The client encodes the payload (numpy arrays stay arrays until
    the client serializes them) and the runner batches observations with equal ``prompt_key``.
    """

    family: ClassVar[str]
    #: body encoding the client must use for this adapter's payloads: "msgpack" or "json"
    wire_format: str = "msgpack"

    @abstractmethod
    def prompt_key(self, obs: Observation) -> str:
        """Requests are grouped by identical key (the server rejects mixed prompts)."""

    @abstractmethod
    def build_request(self, observations: list[Observation], request_id: str) -> dict[str, Any]:
        """Request payload for a batch of observations (numpy arrays inside)."""

    @abstractmethod
    def parse_response(self, response: dict[str, Any], batch_size: int) -> np.ndarray:
        """LIBERO actions ``float64[batch_size, num_action_chunks, 7]`` from a response body;
        raises ``PolicyResponseError`` on a malformed response."""

    @abstractmethod
    def settings_summary(self) -> dict[str, Any]:
        """JSON-serializable settings for provenance records."""
