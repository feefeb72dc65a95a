"""Scene view over the privileged state: bodies, region sites and articulated joints as the
expert reads them from ``privileged_state``, and the gripper-yaw helpers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from libero_eval.reference.policies.scripted.robot import R_DOWN

PRIVILEGED_STATE_HINT = (
    "the scripted expert plans from privileged simulator state: enable "
    "rollout.send_privileged_state so the env worker sends "
    "libero_eval.rollout.privileged.privileged_state(env, obs) with every request"
)


@dataclass
class Body:
    """An object or fixture: pose and world axis-aligned bounding box."""

    name: str
    pos: np.ndarray
    rot: np.ndarray
    bbox_min: np.ndarray
    bbox_max: np.ndarray
    fixture: bool
    grasped: bool
    touched: bool
    local_size: np.ndarray | None = None
    ray_clearance: np.ndarray | None = None

    @property
    def center(self) -> np.ndarray:
        return (self.bbox_min + self.bbox_max) / 2.0

    @property
    def size(self) -> np.ndarray:
        return self.bbox_max - self.bbox_min

    @property
    def top(self) -> float:
        return float(self.bbox_max[2])

    @property
    def bottom(self) -> float:
        return float(self.bbox_min[2])


@dataclass
class Site:
    name: str
    pos: np.ndarray
    xmat: np.ndarray
    size: np.ndarray
    parent: str | None
    joints: list[str] = field(default_factory=list)


@dataclass
class Joint:
    name: str
    owner: str
    type: str
    qpos: float
    axis: np.ndarray
    anchor: np.ndarray
    bbox_min: np.ndarray | None
    bbox_max: np.ndarray | None
    geoms: np.ndarray = field(default_factory=lambda: np.zeros((0, 6)))  # [min xyz, max xyz]


@dataclass
class Scene:
    eef_pos: np.ndarray
    eef_vel: np.ndarray
    eef_rot: np.ndarray
    gripper_width: float
    bodies: dict[str, Body]
    sites: dict[str, Site]
    joints: dict[str, Joint]
    articulation: dict[str, dict[str, list[float]]]
    goal: list[list[str]]
    goal_satisfied: list[bool]

    @classmethod
    def from_state(cls, state: Any) -> Scene:
        if not isinstance(state, dict):
            raise ValueError(
                f"privileged_state must be a dict, got {type(state).__name__}; "
                + PRIVILEGED_STATE_HINT
            )
        missing = [k for k in ("robot", "objects", "goal", "goal_satisfied") if k not in state]
        if missing:
            raise ValueError(f"privileged_state lacks field(s) {missing}; {PRIVILEGED_STATE_HINT}")
        robot = state["robot"]
        try:
            eef_pos = np.asarray(robot["eef_pos"], dtype=np.float64).reshape(3)
            eef_rot = Rotation.from_quat(robot["eef_quat"]).as_matrix()
            qpos = np.asarray(robot["gripper_qpos"], dtype=np.float64).reshape(2)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                "privileged_state.robot needs eef_pos [3], eef_quat [4] (x, y, z, w) and "
                f"gripper_qpos [2] ({exc}); {PRIVILEGED_STATE_HINT}"
            ) from exc
        bodies = {}
        for name, entry in state["objects"].items():
            pos = np.asarray(entry["pos"], dtype=np.float64)
            bodies[name] = Body(
                name=name,
                pos=pos,
                rot=Rotation.from_quat(entry["quat"]).as_matrix(),
                bbox_min=np.asarray(entry.get("bbox_min", pos), dtype=np.float64),
                bbox_max=np.asarray(entry.get("bbox_max", pos), dtype=np.float64),
                fixture=bool(entry.get("fixture", False)),
                grasped=bool(entry.get("grasped", False)),
                touched=bool(entry.get("touched", False)),
                local_size=(
                    np.asarray(entry["local_bbox_max"], dtype=np.float64)
                    - np.asarray(entry["local_bbox_min"], dtype=np.float64)
                    if "local_bbox_min" in entry and "local_bbox_max" in entry
                    else None
                ),
                ray_clearance=(
                    np.asarray(entry["ray_clearance"], dtype=np.float64)
                    if "ray_clearance" in entry
                    else None
                ),
            )
        sites = {
            name: Site(
                name=name,
                pos=np.asarray(entry["pos"], dtype=np.float64),
                xmat=np.asarray(entry["xmat"], dtype=np.float64).reshape(3, 3),
                size=np.asarray(entry["size"], dtype=np.float64),
                parent=entry.get("parent"),
                joints=[str(j) for j in entry.get("joints", [])],
            )
            for name, entry in state.get("sites", {}).items()
        }
        joints = {
            name: Joint(
                name=name,
                owner=entry["owner"],
                type=entry["type"],
                qpos=float(entry["qpos"]),
                axis=np.asarray(entry["axis"], dtype=np.float64),
                anchor=np.asarray(entry["anchor"], dtype=np.float64),
                bbox_min=np.asarray(entry["bbox_min"]) if "bbox_min" in entry else None,
                bbox_max=np.asarray(entry["bbox_max"]) if "bbox_max" in entry else None,
                geoms=np.asarray(entry.get("geoms", []), dtype=np.float64).reshape(-1, 6),
            )
            for name, entry in state.get("joints", {}).items()
        }
        return cls(
            eef_pos=eef_pos,
            eef_vel=np.asarray(robot.get("eef_vel", [0.0, 0.0, 0.0]), dtype=np.float64),
            eef_rot=eef_rot,
            gripper_width=float(qpos[0] - qpos[1]),
            bodies=bodies,
            sites=sites,
            joints=joints,
            articulation=state.get("articulation", {}),
            goal=[list(p) for p in state["goal"]],
            goal_satisfied=[bool(s) for s in state["goal_satisfied"]],
        )

    def body(self, name: str) -> Body:
        if name not in self.bodies:
            raise ValueError(
                f"privileged_state.objects has no entry {name!r} named by the goal "
                f"(objects: {sorted(self.bodies)}); {PRIVILEGED_STATE_HINT}"
            )
        return self.bodies[name]

    @property
    def eef_yaw(self) -> float:
        return _yaw_of(self.eef_rot)


def _yaw_of(rot: np.ndarray) -> float:
    return math.atan2(rot[1, 0], rot[0, 0])


def wrap_angle(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def down_rotation(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ R_DOWN


def yaw_for_closing_axis(direction_xy: np.ndarray, current_yaw: float) -> float:
    """Gripper yaw whose finger-closing axis is parallel to ``direction_xy``, nearest the
    current yaw and within [-pi/2, pi/2] of home (wrist joint range)."""
    base = math.atan2(direction_xy[1], direction_xy[0]) + math.pi / 2
    candidates = [wrap_angle(base + k * math.pi) for k in (-1, 0, 1)]
    candidates = [c for c in candidates if abs(c) <= math.pi / 2 + 1e-6] or candidates
    return min(candidates, key=lambda c: abs(wrap_angle(c - current_yaw)))
