"""The interface of server-side policies: observations in, LIBERO 7-D action chunks out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

# One observation of a request as a family's part of the server parsed it (re-exported here,
# where the policies take it).
from libero_eval.policy.reference_host import PolicyItem

__all__ = ["PolicyItem", "ServerPolicy"]


class ServerPolicy(ABC):
    """A policy the reference server can serve.

    ``act`` gets the items of one request and returns one LIBERO action chunk per item:
    ``float[action_horizon, 7] = [dx, dy, dz, ax, ay, az, gripper]`` with an axis-angle
    rotation delta and gripper -1 open / +1 close. The family's part of the server puts the
    chunks into its model's form. ``act`` runs in a worker thread, one batch at a time.
    """

    name: ClassVar[str]

    @abstractmethod
    def act(self, items: list[PolicyItem], action_horizon: int) -> list[np.ndarray]:
        """One ``[action_horizon, 7]`` LIBERO chunk per item, in item order."""
