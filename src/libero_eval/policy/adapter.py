"""The interface every model-family adapter implements: observations -> request body,
response body -> LIBERO actions. A new SGLang action policy family is one new module."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from libero_eval.policy.errors import PolicyResponseError


@dataclass
class Observation:
    """One env's observation at a policy query."""

    agentview: np.ndarray  # uint8 [H, W, 3] exactly as LIBERO renders it (upside down)
    wrist: np.ndarray  # uint8 [H, W, 3], same orientation
    task_language: str
    privileged_state: dict[str, Any] | None = None  # only with rollout.send_privileged_state
    # LIBERO's proprioception as the env reports it: robot0_eef_pos [3], robot0_eef_quat [4]
    # (x, y, z, w), robot0_gripper_qpos [2]; what π0.5 builds its 8-D state from
    proprio: dict[str, np.ndarray] | None = None
    # the episode's run seed minus the run's first seed (plan.seeds): the adapter adds it to
    # the policy's sampling seed; 0 in a single-seed run, whose requests are unchanged
    sampling_seed_offset: int = 0


class PolicyAdapter(ABC):
    """Translate between LIBERO observations/actions and one model family's request format.

    Adapters are pure: no transport. A ``PolicyConnection`` (``libero_eval.policy.connection``)
    encodes and sends the payload (numpy arrays stay arrays until it serializes them) and the
    runner batches observations with equal ``prompt_key``.
    """

    family: ClassVar[str]

    @classmethod
    @abstractmethod
    def check_run_config(cls, config: dict[str, Any]) -> None:
        """What only the whole (schema-validated) config can tell about this family: the server
        backends and pipeline that serve it, the files it needs. Raises ``ValueError`` naming
        the field and the fix; the adapter's own fields are checked when it is built."""

    def check_server_metadata(self, metadata: dict[str, Any]) -> None:
        """Raise ``PolicyResponseError`` when the server's metadata shows another family."""
        served = metadata.get("policy_family") if isinstance(metadata, dict) else None
        if served is not None and served != self.family:
            raise PolicyResponseError(
                f"the policy server serves family {served!r} but policy.family is "
                f"{self.family!r}; point the run at a {self.family} server or set policy.family"
            )

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

    def statistics(self) -> dict[str, str | None]:
        """The statistics file the client (de)normalizes with, as read: its path and sha256
        (both None when the server holds the statistics)."""
        return {"path": None, "sha256": None}

    @abstractmethod
    def outcome_settings(self) -> dict[str, Any]:
        """The family's `policy.*` settings that can change an episode's outcome (transport and
        timeouts left out), with the statistics file as its sha256: the policy's part of the
        rollout fingerprint (`libero_eval.config`)."""
