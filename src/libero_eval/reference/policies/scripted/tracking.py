"""Waypoints and the open-loop chunk tracker: a skill's waypoints become one action chunk
through a kinematic model of the OSC_POSE controller."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from libero_eval.reference.policies.scripted.robot import (
    GRIPPER_OPEN,
    GRIPPER_READY_WIDTH,
    GRIPPER_WIDTH_OPEN,
    GRIPPER_WIDTH_PER_STEP,
    METRES_PER_STEP_PER_ACTION,
    RADIANS_PER_STEP_PER_ACTION,
    ROTATION_ACTION_LIMIT,
    TRANSLATION_ACTION_HIGH,
    TRANSLATION_ACTION_LOW,
)
from libero_eval.reference.policies.scripted.scene import Scene, down_rotation

CONTROL_PERIOD = 0.05  # seconds per env step (20 Hz)
# First-order model of the OSC velocity response: v += RESPONSE_RATE * (commanded - v).
RESPONSE_RATE = 0.5
LAG_COMPENSATION = 0.5  # extra command on the velocity error (1 / RESPONSE_RATE - 1: dead-beat)
POSITION_GAIN = 0.45  # fraction of the remaining predicted error covered per step
ROTATION_GAIN = 0.5


@dataclass
class Waypoint:
    """Drive the end effector to ``pos`` (and gripper yaw ``yaw``; None keeps the current yaw)
    with ``gripper`` commanded; then stay ``hold`` steps before the next waypoint."""

    pos: np.ndarray
    gripper: float
    yaw: float | None = None
    tol: float = 0.008
    hold: int = 0
    speed: float = 1.0
    wait_for_open: bool = False
    label: str = ""
    # constant extra translation action (not in the motion prediction): keeps pressing against
    # a contact the end effector cannot move into, e.g. down on a drawer handle
    bias: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass
class Plan:
    waypoints: list[Waypoint]
    label: str


def _translation_action(step: np.ndarray) -> np.ndarray:
    """Action for a desired per-step displacement, scaled as a whole into the bounds."""
    action = step / METRES_PER_STEP_PER_ACTION
    scale = 1.0
    for axis in range(3):
        if action[axis] > TRANSLATION_ACTION_HIGH[axis]:
            scale = min(scale, TRANSLATION_ACTION_HIGH[axis] / action[axis])
        elif action[axis] < TRANSLATION_ACTION_LOW[axis]:
            scale = min(scale, TRANSLATION_ACTION_LOW[axis] / action[axis])
    return action * scale


def track_waypoints(scene: Scene, waypoints: list[Waypoint], horizon: int) -> np.ndarray:
    """Open-loop actions ``[horizon, 7]`` following the waypoints: a proportional controller
    on the predicted end effector, whose motion is modelled as a first-order lag toward the
    commanded velocity (starting from the measured one); rotation toward a down-pointing
    gripper at the waypoint's yaw; the gripper width as a ramp."""
    pos = scene.eef_pos.copy()
    velocity = scene.eef_vel * CONTROL_PERIOD  # metres per step
    rot = scene.eef_rot.copy()
    width = scene.gripper_width
    yaw_target = scene.eef_yaw
    actions: list[np.ndarray] = []
    index = 0
    held = 0
    last_gripper = waypoints[0].gripper if waypoints else GRIPPER_OPEN
    final_hold = Waypoint(pos=pos.copy(), gripper=last_gripper)
    guard = 0
    while len(actions) < horizon:
        guard += 1
        if guard > 10 * horizon + 10 * len(waypoints):
            break
        waypoint = waypoints[index] if index < len(waypoints) else final_hold
        if waypoint.yaw is not None:
            yaw_target = waypoint.yaw
        gripper = waypoint.gripper
        last_gripper = gripper
        waiting = waypoint.wait_for_open and width < GRIPPER_READY_WIDTH
        target = pos if waiting else waypoint.pos
        error = target - pos
        rot_error = Rotation.from_matrix(down_rotation(yaw_target) @ rot.T).as_rotvec()
        arrived = (
            not waiting
            and float(np.linalg.norm(error)) < waypoint.tol
            and float(np.linalg.norm(rot_error)) < 0.06
        )
        if arrived and index < len(waypoints):
            if held >= waypoint.hold:
                index += 1
                held = 0
                if index >= len(waypoints):
                    final_hold = Waypoint(pos=waypoint.pos.copy(), gripper=waypoint.gripper)
                continue
            held += 1
        max_step = METRES_PER_STEP_PER_ACTION * TRANSLATION_ACTION_HIGH.min() * waypoint.speed
        desired = error * POSITION_GAIN
        norm = float(np.linalg.norm(desired))
        if norm > max_step:
            desired *= max_step / norm
        translation = _translation_action(desired + LAG_COMPENSATION * (desired - velocity))
        rotation = np.clip(
            rot_error * ROTATION_GAIN / RADIANS_PER_STEP_PER_ACTION,
            -ROTATION_ACTION_LIMIT,
            ROTATION_ACTION_LIMIT,
        )
        commanded = translation + np.asarray(waypoint.bias)
        actions.append(
            np.concatenate(
                [_translation_action(commanded * METRES_PER_STEP_PER_ACTION), rotation, [gripper]]
            )
        )
        velocity = velocity + RESPONSE_RATE * (translation * METRES_PER_STEP_PER_ACTION - velocity)
        pos = pos + velocity
        rot = Rotation.from_rotvec(rotation * RADIANS_PER_STEP_PER_ACTION).as_matrix() @ rot
        target_width = GRIPPER_WIDTH_OPEN if gripper < 0 else 0.0
        width += float(
            np.clip(target_width - width, -GRIPPER_WIDTH_PER_STEP, GRIPPER_WIDTH_PER_STEP)
        )
    while len(actions) < horizon:
        actions.append(np.array([0, 0, 0, 0, 0, 0, last_gripper], dtype=np.float64))
    return np.asarray(actions, dtype=np.float64)
