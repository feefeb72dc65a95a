"""Articulated parts: drawers, doors and knobs (``open``, ``close``, ``turnon``, ``turnoff``),
moved by straight pushes of the closed gripper or, to open a drawer, by dragging its handle."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libero_eval.reference.policies.scripted.geometry import hand_blocked, transit
from libero_eval.reference.policies.scripted.robot import FINGERTIP_BELOW_EEF, GRIPPER_CLOSE
from libero_eval.reference.policies.scripted.scene import (
    PRIVILEGED_STATE_HINT,
    Joint,
    Scene,
    wrap_angle,
    yaw_for_closing_axis,
)
from libero_eval.reference.policies.scripted.tracking import Plan, Waypoint

HANDLE_PRESS_DEPTH = 0.02  # command the fingertips this far into a drawer handle's top
HANDLE_PRESS_ACTION = 0.35  # extra downward action while pressing on a handle
DRAG_SPEED = 0.3  # fraction of full speed while dragging a drawer by friction
PUSH_STANDOFF = 0.04  # end effector this far before the contact point when a push starts
PUSH_BELOW_TOP = 0.012  # push this far below the top of the lever geom

RANGE_KEYS = {
    "open": "default_open_ranges",
    "close": "default_close_ranges",
    "turnon": "default_turnon_ranges",
    "turnoff": "default_turnoff_ranges",
}


def articulated_joint(scene: Scene, name: str) -> Joint:
    """The joint a predicate argument moves: a region site's joint (a drawer) or a fixture's."""
    if name in scene.sites and scene.sites[name].joints:
        joint_name = scene.sites[name].joints[0]
        if joint_name in scene.joints:
            return scene.joints[joint_name]
    owned = [joint for joint in scene.joints.values() if joint.owner == name]
    if owned:
        return owned[0]
    raise ValueError(
        f"{name!r} has no articulated joint in privileged_state.joints "
        f"(joints: {sorted(scene.joints)}); {PRIVILEGED_STATE_HINT}"
    )


def joint_goal(scene: Scene, joint: Joint, relation: str) -> float:
    """A joint position safely inside the range that makes ``relation`` true."""
    values = scene.articulation.get(joint.owner, {}).get(RANGE_KEYS[relation])
    if not values:
        raise NotImplementedError(f"{joint.owner} has no {RANGE_KEYS[relation]} to {relation}")
    low, high = float(min(values)), float(max(values))
    margin = min((high - low) / 2, 0.15 if joint.type == "hinge" else 0.008)
    if abs(joint.qpos - low) <= abs(joint.qpos - high):
        return low + margin
    return high - margin


def joint_satisfied(scene: Scene, joint: Joint, relation: str) -> bool:
    """Whether the joint is already in the range for ``relation`` (as the goal check sees it)."""
    values = scene.articulation.get(joint.owner, {}).get(RANGE_KEYS[relation])
    if not values:
        return False
    return float(min(values)) <= joint.qpos <= float(max(values)) or (
        relation == "open" and _beyond(joint, values)
    )


def _beyond(joint: Joint, values: list[float]) -> bool:
    # LIBERO's is_open checks one side only (e.g. qpos < max(open range) for drawers)
    return joint.qpos < max(values) if max(values) <= 0 else joint.qpos > min(values)


@dataclass
class Push:
    start: np.ndarray  # end effector before contact
    end: np.ndarray  # end effector after pushing
    direction: np.ndarray  # unit, horizontal


def plan_push(joint: Joint, target_qpos: float, eef: np.ndarray | None = None) -> Push:
    """A straight push of the closed gripper that moves ``joint`` toward ``target_qpos``:
    the face of a slide part opposite the motion, or the lever point of a hinge part (the
    point farthest from the axis: a knob's ridge end, a door's free edge)."""
    sign = 1.0 if target_qpos > joint.qpos else -1.0
    corners = _geom_corners(joint.geoms)
    if joint.type == "slide":
        direction = joint.axis * sign
        direction = _horizontal_unit(direction)
        along = corners.reshape(-1, 3) @ np.append(direction, 0.0)
        # The contact geom: the one reaching farthest against the motion (handle front).
        per_geom = (corners @ np.append(direction, 0.0)).min(axis=1)
        index = int(np.argmin(per_geom))
        box = joint.geoms[index]
        center = (box[:3] + box[3:]) / 2
        contact = center.copy()
        contact[:2] += direction * (float(along.min()) - float(center[:2] @ direction))
        travel = abs(target_qpos - joint.qpos) + 0.015
        start = contact - np.append(direction, 0.0) * PUSH_STANDOFF
        end = contact + np.append(direction, 0.0) * travel
        return Push(start=start, end=end, direction=direction)
    axis = joint.axis / max(float(np.linalg.norm(joint.axis)), 1e-9)
    # Lever: the top part (a knob's ridge, a door's panel), its point farthest from the axis;
    # of the two ends of a symmetric part, the one nearer the gripper.
    tops = joint.geoms[:, 5]
    upper = np.flatnonzero(tops >= tops.max() - 0.015)
    flat = corners[upper].reshape(-1, 3)
    relative = flat - joint.anchor
    radial = relative - np.outer(relative @ axis, axis)
    radius = np.linalg.norm(radial, axis=1)
    far = radius >= radius.max() - 0.02
    if eef is not None:
        distance = np.linalg.norm(flat[:, :2] - eef[:2], axis=1)
        index = int(np.flatnonzero(far)[np.argmin(distance[far])])
    else:
        index = int(np.argmax(radius))
    r_hat = radial[index] / max(float(radius[index]), 1e-9)
    tangent = _horizontal_unit(sign * np.cross(axis, r_hat))
    lever = flat[index].copy()
    lever[2] = float(tops[upper].max()) - PUSH_BELOW_TOP
    lever[:2] -= r_hat[:2] * 0.012
    start = lever - np.append(tangent, 0.0) * PUSH_STANDOFF
    end = lever + np.append(tangent, 0.0) * 0.05
    return Push(start=start, end=end, direction=tangent)


def _geom_corners(geoms: np.ndarray) -> np.ndarray:
    """[N, 8, 3] corners of axis-aligned boxes given as [min xyz, max xyz] rows."""
    signs = np.array(np.meshgrid([0, 1], [0, 1], [0, 1])).T.reshape(-1, 3)
    low, high = geoms[:, None, :3], geoms[:, None, 3:]
    return low + signs[None] * (high - low)


def _horizontal_unit(vector: np.ndarray) -> np.ndarray:
    flat = np.asarray(vector[:2], dtype=np.float64)
    norm = float(np.linalg.norm(flat))
    return flat / norm if norm > 1e-9 else np.array([1.0, 0.0])


def plan_articulation(scene: Scene, relation: str, name: str) -> Plan:
    """Move a drawer, door or knob with pushes of the closed gripper (open drawers: pull)."""
    joint = articulated_joint(scene, name)
    target = joint_goal(scene, joint, relation)
    if joint.geoms.size == 0:
        raise ValueError(f"privileged_state.joints[{joint.name!r}] has no geoms to push")
    if joint.type == "slide" and relation == "open":
        return plan_pull_drawer(scene, joint, target)
    eef = scene.eef_pos
    push = plan_push(joint, target, eef)
    yaw = (
        yaw_for_closing_axis(np.array([-push.direction[1], push.direction[0]]), scene.eef_yaw)
        if joint.type == "slide"
        else None
    )
    line = push.end - push.start
    length = float(np.linalg.norm(line[:2]))
    along = float((eef[:2] - push.start[:2]) @ push.direction)
    perpendicular = float(np.linalg.norm(eef[:2] - push.start[:2] - along * push.direction))
    on_line = (
        perpendicular < 0.02
        and -0.03 < along < length + 0.02
        and abs(eef[2] - push.start[2]) < 0.02
    )
    if on_line and scene.gripper_width < 0.02:
        return Plan(
            [Waypoint(pos=push.end, gripper=GRIPPER_CLOSE, yaw=yaw, tol=0.005, speed=0.6)],
            "push",
        )
    above = push.start + np.array([0.0, 0.0, 0.06])
    waypoints = _closed_approach(
        scene, eef, above, yaw, far=float(np.linalg.norm(eef[:2] - push.start[:2])) > 0.02
    )
    waypoints.append(Waypoint(pos=push.start, gripper=GRIPPER_CLOSE, yaw=yaw, tol=0.006, speed=0.7))
    waypoints.append(Waypoint(pos=push.end, gripper=GRIPPER_CLOSE, yaw=yaw, tol=0.005, speed=0.6))
    return Plan(waypoints, "approach-push")


def plan_pull_drawer(scene: Scene, joint: Joint, target_qpos: float) -> Plan:
    """Open a drawer by pressing the closed gripper down on its handle and dragging it out
    (friction does the pulling; a vertical gripper cannot hook the handle)."""
    direction = _horizontal_unit(joint.axis * (1.0 if target_qpos > joint.qpos else -1.0))
    flat_direction = np.append(direction, 0.0)
    centers = (joint.geoms[:, :3] + joint.geoms[:, 3:]) / 2
    handle = joint.geoms[int(np.argmax(centers @ flat_direction))]
    handle_center = (handle[:3] + handle[3:]) / 2
    press = handle_center.copy()
    press[2] = handle[5] + FINGERTIP_BELOW_EEF - HANDLE_PRESS_DEPTH
    travel = abs(target_qpos - joint.qpos) + 0.02
    drag_end = press + flat_direction * travel
    # hand thin side toward the drag unless turning the other way is quicker and the hand
    # (then long along the drag) clears everything above the handle
    across_yaw = yaw_for_closing_axis(np.array([-direction[1], direction[0]]), scene.eef_yaw)
    along_yaw = yaw_for_closing_axis(direction, scene.eef_yaw)
    yaw = across_yaw
    if abs(wrap_angle(along_yaw - scene.eef_yaw)) < abs(
        wrap_angle(across_yaw - scene.eef_yaw)
    ) and not (hand_blocked(scene, press[:2], along_yaw, handle[5] + FINGERTIP_BELOW_EEF)):
        yaw = along_yaw
    eef = scene.eef_pos
    offset = eef[:2] - press[:2]
    along = float(offset @ direction)
    across = float(np.linalg.norm(offset - along * direction))
    on_handle = across < 0.02 and -0.02 < along < 0.03 and eef[2] < handle[5] + 0.03
    if on_handle and scene.gripper_width < 0.02:
        return Plan(
            [
                Waypoint(
                    pos=drag_end,
                    gripper=GRIPPER_CLOSE,
                    yaw=yaw,
                    tol=0.005,
                    speed=DRAG_SPEED,
                    bias=(0.0, 0.0, -HANDLE_PRESS_ACTION),
                )
            ],
            "drag",
        )
    above = press + np.array([0.0, 0.0, 0.06])
    waypoints = _closed_approach(scene, eef, above, yaw, far=float(np.linalg.norm(offset)) > 0.02)
    waypoints.append(
        Waypoint(
            pos=press,
            gripper=GRIPPER_CLOSE,
            yaw=yaw,
            tol=0.006,
            speed=0.6,
            hold=3,
            bias=(0.0, 0.0, -HANDLE_PRESS_ACTION),
        )
    )
    waypoints.append(
        Waypoint(
            pos=drag_end,
            gripper=GRIPPER_CLOSE,
            yaw=yaw,
            tol=0.005,
            speed=DRAG_SPEED,
            bias=(0.0, 0.0, -HANDLE_PRESS_ACTION),
        )
    )
    return Plan(waypoints, "approach-drag")


def _closed_approach(
    scene: Scene, eef: np.ndarray, above: np.ndarray, yaw: float, far: bool
) -> list[Waypoint]:
    """With the gripper closed: a transit to `above` when `far`, then settle there."""
    waypoints = (
        transit(
            scene,
            eef,
            above,
            exclude=set(),
            extra_below=FINGERTIP_BELOW_EEF,
            gripper=GRIPPER_CLOSE,
            yaw=yaw,
        )
        if far
        else []
    )
    waypoints.append(Waypoint(pos=above, gripper=GRIPPER_CLOSE, yaw=yaw, tol=0.01))
    return waypoints
