"""``hold``: keep the arm still with the gripper open."""

from __future__ import annotations

import numpy as np

from libero_eval.reference.policies.base import PolicyItem, ServerPolicy

GRIPPER_OPEN = -1.0


class HoldPolicy(ServerPolicy):
    """Zero translation, zero rotation, gripper open (-1) at every step of every chunk."""

    name = "hold"

    def act(self, items: list[PolicyItem], action_horizon: int) -> list[np.ndarray]:
        chunk = np.zeros((action_horizon, 7), dtype=np.float64)
        chunk[:, 6] = GRIPPER_OPEN
        return [chunk.copy() for _ in items]
