"""Geometry the skills share: heights that clear the bodies along a path, a body's horizontal
axes, whether the hand's box is blocked, gaps between boxes, and the transit over obstacles."""

from __future__ import annotations

import math

import numpy as np

from libero_eval.reference.policies.scripted.robot import (
    HAND_BOTTOM_ABOVE_EEF,
    HAND_HALF_LENGTH,
    HAND_HALF_THICKNESS,
)
from libero_eval.reference.policies.scripted.scene import Body, Scene
from libero_eval.reference.policies.scripted.tracking import Waypoint


def _segment_hits_box(
    start: np.ndarray, end: np.ndarray, box_min: np.ndarray, box_max: np.ndarray, margin: float
) -> bool:
    """Whether the xy segment start->end passes within ``margin`` of the box's xy footprint."""
    for t in np.linspace(0.0, 1.0, 25):
        point = start[:2] + t * (end[:2] - start[:2])
        if np.all(point >= box_min[:2] - margin) and np.all(point <= box_max[:2] + margin):
            return True
    return False


def clearance_height(
    scene: Scene, start: np.ndarray, end: np.ndarray, exclude: set[str], margin: float = 0.035
) -> float:
    """Highest top of the bodies under the xy path start->end (plus ``margin``)."""
    height = -np.inf
    for body in scene.bodies.values():
        if body.name in exclude:
            continue
        if _segment_hits_box(start, end, body.bbox_min, body.bbox_max, margin):
            height = max(height, body.top)
    return float(height)


def hand_clearance_height(
    scene: Scene, start: np.ndarray, end: np.ndarray, yaw: float, exclude: set[str]
) -> float:
    """Lowest end-effector height at which the hand (long along the closing axis at ``yaw``)
    passes over the bodies along the xy path start->end."""
    closing = np.array([math.sin(yaw), -math.cos(yaw)])
    across = np.array([math.cos(yaw), math.sin(yaw)])
    offsets = [
        closing * along + across * side
        for along in np.linspace(-HAND_HALF_LENGTH, HAND_HALF_LENGTH, 7)
        for side in (-HAND_HALF_THICKNESS, HAND_HALF_THICKNESS)
    ]
    bodies = [b for b in scene.bodies.values() if b.name not in exclude]
    if not bodies:
        return -np.inf
    low = np.array([b.bbox_min[:2] for b in bodies])
    high = np.array([b.bbox_max[:2] for b in bodies])
    tops = np.array([b.top for b in bodies])
    height = -np.inf
    for t in np.linspace(0.1, 1.0, 10):  # not where the hand already is
        center = start[:2] + t * (end[:2] - start[:2])
        for offset in offsets:
            point = center + offset
            under = np.all(low <= point, axis=1) & np.all(point <= high, axis=1)
            if np.any(under):
                height = max(height, float(tops[under].max()))
    return height - HAND_BOTTOM_ABOVE_EEF + 0.015


def horizontal_axes(body: Body) -> list[tuple[np.ndarray, float]]:
    """The body's two most horizontal local axes as (unit xy direction, extent along it)."""
    local_extent = _local_extent(body)
    verticality = np.abs(body.rot[2, :])
    vertical = int(np.argmax(verticality))
    axes = []
    for i in range(3):
        if i == vertical:
            continue
        direction = body.rot[:2, i]
        norm = float(np.linalg.norm(direction))
        if norm < 1e-6:
            continue
        axes.append((direction / norm, float(local_extent[i])))
    return axes


def _local_extent(body: Body) -> np.ndarray:
    """Extents along the body's own axes (its body-frame box, else the world box)."""
    if body.local_size is not None:
        return np.maximum(body.local_size, 1e-3)
    return np.maximum(np.abs(body.rot.T) @ body.size, 1e-3)


def hand_blocked(
    scene: Scene, xy: np.ndarray, yaw: float, z: float, exclude: set[str] | None = None
) -> bool:
    """Whether any body or articulated part's box reaches into the hand's box (above the
    fingers, long along the closing axis) for the end effector at ``xy``, ``z``, ``yaw``."""
    exclude = exclude or set()
    boxes = [geoms for joint in scene.joints.values() for geoms in joint.geoms]
    boxes += [
        np.concatenate([b.bbox_min, b.bbox_max])
        for b in scene.bodies.values()
        if b.name not in exclude
    ]
    stacked = np.asarray(boxes)
    closing = np.array([math.sin(yaw), -math.cos(yaw)])
    across = np.array([math.cos(yaw), math.sin(yaw)])
    low_z = z + HAND_BOTTOM_ABOVE_EEF
    for along in np.linspace(-HAND_HALF_LENGTH, HAND_HALF_LENGTH, 9):
        for side in (-HAND_HALF_THICKNESS, 0.0, HAND_HALF_THICKNESS):
            point = xy + closing * along + across * side
            inside = np.all(stacked[:, :2] <= point, axis=1) & np.all(
                point <= stacked[:, 3:5], axis=1
            )
            if np.any(inside & (stacked[:, 5] > low_z) & (stacked[:, 2] < low_z + 0.1)):
                return True
    return False


def box_gap(low_a: np.ndarray, high_a: np.ndarray, low_b: np.ndarray, high_b: np.ndarray) -> float:
    """Distance between two axis-aligned rectangles (negative: overlap depth)."""
    gaps = np.maximum(low_b - high_a, low_a - high_b)
    if np.all(gaps < 0):
        return float(gaps.max())
    return float(np.linalg.norm(np.maximum(gaps, 0.0)))


def transit(
    scene: Scene,
    start: np.ndarray,
    goal: np.ndarray,
    exclude: set[str],
    extra_below: float,
    gripper: float,
    yaw: float | None,
) -> list[Waypoint]:
    """Rise if needed, move over ``goal`` at a height where what hangs below the end effector
    (fingers, a held object) and the hand above clear the bodies in between."""
    clear = clearance_height(scene, start, goal, exclude) + 0.03 + extra_below
    hand_yaw = yaw if yaw is not None else scene.eef_yaw
    clear = max(clear, hand_clearance_height(scene, start, goal, hand_yaw, exclude))
    cruise = max(clear, goal[2])
    waypoints = []
    if start[2] < cruise - 0.01:
        rise = np.array([start[0], start[1], cruise])
        waypoints.append(Waypoint(pos=rise, gripper=gripper, yaw=yaw, tol=0.02, label="rise"))
    over = np.array([goal[0], goal[1], cruise])
    waypoints.append(Waypoint(pos=over, gripper=gripper, yaw=yaw, tol=0.015, label="transit"))
    return waypoints
