"""The interface of server-side policies: observations in, LIBERO 7-D action chunks out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class PolicyItem:
    """One observation of a batched request, as the reference server parsed it."""

    image: np.ndarray  # uint8 [H, W, 3], exactly the pixels the client sent
    prompt: str
    privileged_state: dict[str, Any] | None = None  # input.privileged_state[i]; ours only
    seed: int | None = None  # the request's parameters.seed (SGLang's default 42 if unset)


class ServerPolicy(ABC):
    """A policy the reference server can serve.

    ``act`` gets the items of one request and returns one LIBERO action chunk per item:
    ``float[action_horizon, 7] = [dx, dy, dz, ax, ay, az, gripper]`` with an axis-angle
    rotation delta and gripper -1 open / +1 close. The server normalizes the chunks into the
    model's 10-channel form. ``act`` runs in a worker thread, one request at a time.
    """

    name: ClassVar[str]

    @abstractmethod
    def act(self, items: list[PolicyItem], action_horizon: int) -> list[np.ndarray]:
        """One ``[action_horizon, 7]`` LIBERO chunk per item, in item order."""
