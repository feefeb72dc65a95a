"""``scripted``: a stateless expert that plans LIBERO skills from privileged simulator state.

Each query carries :func:`libero_eval.rollout.privileged.privileged_state` of the current
step. The expert picks the first goal predicate that does not hold yet (``open`` / ``turnon``
first, then ``on`` / ``in``, then ``close`` / ``turnoff``), infers the phase of the matching
skill from the state alone (e.g. both finger pads touching the object = grasped), turns it
into a few end-effector waypoints and tracks them open loop for the chunk with a kinematic
model of the OSC_POSE controller. Nothing is remembered between calls: the next query
re-plans from the new state.

Skills: pick-and-place (``on``, ``in``: top-down grasps, rim grasps for bowls, mugs and
plates, obstacle-clearing transit heights), drawers and doors (``open``, ``close``) and
knobs (``turnon``, ``turnoff``).

Actions are LIBERO 7-D ``[dx, dy, dz, ax, ay, az, gripper]``: gripper exactly -1 or +1,
translation and rotation within the Cosmos3 LIBERO stats' q01..q99 range so that the round
trip through the model's normalized rot6d encoding does not clip them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from libero_eval.reference.policies.base import PolicyItem, ServerPolicy

GRIPPER_OPEN = -1.0
GRIPPER_CLOSE = 1.0

# OSC_POSE response (robosuite defaults, 20 Hz): steady-state end-effector travel per step per
# unit of action, measured in LIBERO.
METRES_PER_STEP_PER_ACTION = 0.0135
RADIANS_PER_STEP_PER_ACTION = 0.12
# Action bounds inside the stats' q01..q99 (translation) and rot6d q01..q99 (rotation).
TRANSLATION_ACTION_LOW = np.array([-0.70, -0.78, -0.90])
TRANSLATION_ACTION_HIGH = np.array([0.90, 0.84, 0.90])
ROTATION_ACTION_LIMIT = np.array([0.09, 0.14, 0.20])

CONTROL_PERIOD = 0.05  # seconds per env step (20 Hz)
# First-order model of the OSC velocity response: v += RESPONSE_RATE * (commanded - v).
RESPONSE_RATE = 0.5
LAG_COMPENSATION = 0.5  # extra command on the velocity error (1 / RESPONSE_RATE - 1: dead-beat)
POSITION_GAIN = 0.45  # fraction of the remaining predicted error covered per step
ROTATION_GAIN = 0.5
SLOT_MARGIN = 0.03  # object centers this far inside a shared region's edge
SWEEP_MARGIN = 0.06  # clearance kept from an opening drawer's path (the hand's half width)
DONE_CLEARANCE = 0.08  # once done, keep the gripper this far above the goal objects
HANDLE_PRESS_DEPTH = 0.02  # command the fingertips this far into a drawer handle's top
HANDLE_PRESS_ACTION = 0.35  # extra downward action while pressing on a handle
DRAG_SPEED = 0.3  # fraction of full speed while dragging a drawer by friction
PUSH_STANDOFF = 0.04  # end effector this far before the contact point when a push starts
PUSH_BELOW_TOP = 0.012  # push this far below the top of the lever geom
GRIPPER_WIDTH_OPEN = 0.078  # metres between the finger joints, fully open
GRIPPER_WIDTH_PER_STEP = 0.009
GRIPPER_READY_WIDTH = 0.066  # open enough to descend around an object

# Finger geometry relative to the end-effector site (robot0_eef_pos, between the pads).
FINGERTIP_BELOW_EEF = 0.0145
HAND_BOTTOM_ABOVE_EEF = 0.024  # the hand's box: above the fingers, long along the closing axis
HAND_HALF_LENGTH = 0.105
HAND_HALF_THICKNESS = 0.035
MAX_GRASP_WIDTH = 0.072
TOP_FEATURE_DEPTH = 0.006
RIM_GRASP_NAMES = ("bowl", "mug", "cup", "plate")
RIM_GRASP_DIRECTIONS = 16
RIM_INSET = 0.012  # grasp point inside the outer rim
RIM_GRASP_DEPTH = 0.022  # end effector below the rim top
GRASP_PRESS_DEPTH = 0.01  # keep commanding this far below the grasp point while closing
FINGER_ROOM_RIM = 0.042  # free space needed beyond the rim for the outer finger
FINGER_ROOM_BOX = 0.03  # free space needed on both sides of a box-like object

# Down-pointing gripper with yaw 0 (the LIBERO home orientation).
R_DOWN = np.diag([1.0, -1.0, -1.0])
PRIVILEGED_STATE_HINT = (
    "the scripted expert plans from privileged simulator state: enable "
    "rollout.send_privileged_state so the env worker sends "
    "libero_eval.rollout.privileged.privileged_state(env, obs) with every request"
)


# --------------------------------------------------------------------------------------------
# Scene view over the privileged state
# --------------------------------------------------------------------------------------------


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


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def _down_rotation(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ R_DOWN


def _yaw_for_closing_axis(direction_xy: np.ndarray, current_yaw: float) -> float:
    """Gripper yaw whose finger-closing axis is parallel to ``direction_xy``, nearest the
    current yaw and within [-pi/2, pi/2] of home (wrist joint range)."""
    base = math.atan2(direction_xy[1], direction_xy[0]) + math.pi / 2
    candidates = [_wrap(base + k * math.pi) for k in (-1, 0, 1)]
    candidates = [c for c in candidates if abs(c) <= math.pi / 2 + 1e-6] or candidates
    return min(candidates, key=lambda c: abs(_wrap(c - current_yaw)))


# --------------------------------------------------------------------------------------------
# Waypoints and the open-loop chunk tracker
# --------------------------------------------------------------------------------------------


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
        rot_error = Rotation.from_matrix(_down_rotation(yaw_target) @ rot.T).as_rotvec()
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


# --------------------------------------------------------------------------------------------
# Geometry helpers
# --------------------------------------------------------------------------------------------


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


def _horizontal_axes(body: Body) -> list[tuple[np.ndarray, float]]:
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


# --------------------------------------------------------------------------------------------
# Skills
# --------------------------------------------------------------------------------------------


@dataclass
class Grasp:
    pos: np.ndarray  # end-effector position at the grasp
    yaw: float
    approach_height: float  # above pos, where the vertical descent starts


def _clearance(body: Body, direction: np.ndarray) -> float:
    """Free distance from the body's center along a horizontal direction (ray_clearance,
    the lower of the two nearest sampled rays), or a large value without rays."""
    if body.ray_clearance is None or len(body.ray_clearance) == 0:
        return 1.0
    count = len(body.ray_clearance)
    position = (math.atan2(direction[1], direction[0]) % (2 * math.pi)) / (2 * math.pi) * count
    low = int(math.floor(position)) % count
    high = (low + 1) % count
    return float(min(body.ray_clearance[low], body.ray_clearance[high]))


def _fingers_blocked(
    scene: Scene, body: Body, point_xy: np.ndarray, closing: np.ndarray, z: float
) -> bool:
    """Whether something is in the way of the open gripper at a grasp (end effector at
    ``point_xy``, height ``z``, closing axis ``closing``) or of its vertical descent there:
    finger columns and the hand's footprint against the moving parts of articulated fixtures
    and the boxes of other movable objects (the side rays miss overhangs)."""
    boxes = [geoms for joint in scene.joints.values() for geoms in joint.geoms]
    boxes += [
        np.concatenate([other.bbox_min, other.bbox_max])
        for other in scene.bodies.values()
        if not other.fixture and other.name != body.name
    ]
    if not boxes:
        return False
    stacked = np.asarray(boxes)
    across = np.array([-closing[1], closing[0]])
    probes = []  # (xy, lowest z, highest z) of gripper parts
    for sign in (1.0, -1.0):
        finger = point_xy + sign * closing * (GRIPPER_WIDTH_OPEN / 2 + 0.008)
        probes.append((finger, z - FINGERTIP_BELOW_EEF, z + HAND_BOTTOM_ABOVE_EEF))
    for along in np.linspace(-HAND_HALF_LENGTH, HAND_HALF_LENGTH, 7):
        for side in (-HAND_HALF_THICKNESS, HAND_HALF_THICKNESS):
            point = point_xy + closing * along + across * side
            probes.append((point, z + HAND_BOTTOM_ABOVE_EEF, z + 0.2))
    for xy, low, high in probes:
        inside = np.all(stacked[:, :2] - 0.008 <= xy, axis=1) & np.all(
            xy <= stacked[:, 3:5] + 0.008, axis=1
        )
        overlapping = (stacked[:, 2] < high) & (stacked[:, 5] > low + 0.001)
        if np.any(inside & overlapping):
            return True
    return False


def _hand_blocked(
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


def _grasp_cost(scene: Scene, point_xy: np.ndarray, yaw: float) -> float:
    """Approximate steps to reach a grasp: translation and rotation run in parallel."""
    travel = float(np.linalg.norm(point_xy - scene.eef_pos[:2]))
    turn = abs(_wrap(yaw - scene.eef_yaw))
    max_speed = METRES_PER_STEP_PER_ACTION * float(TRANSLATION_ACTION_HIGH.min())
    max_turn = RADIANS_PER_STEP_PER_ACTION * float(ROTATION_ACTION_LIMIT[2])
    return max(travel / max_speed, turn / max_turn)


def plan_grasp(scene: Scene, body: Body) -> Grasp:
    """Where and how to grasp ``body`` top-down: rim grasps for bowls, mugs and plates (outer
    finger where the rays find room), otherwise across the narrowest horizontal axis that fits
    the gripper with room for both fingers."""
    current_yaw = scene.eef_yaw
    center = body.center
    if any(key in body.name for key in RIM_GRASP_NAMES):
        radius = float(min(body.size[0], body.size[1])) / 2.0
        depth = RIM_GRASP_DEPTH if "plate" not in body.name else 0.008
        z = max(body.top - depth, body.bottom + FINGERTIP_BELOW_EEF)
        options = []
        for k in range(RIM_GRASP_DIRECTIONS):
            angle = 2 * math.pi * k / RIM_GRASP_DIRECTIONS
            direction = np.array([math.cos(angle), math.sin(angle)])
            point = center[:2] + direction * (radius - RIM_INSET)
            gap = _clearance(body, direction) - radius
            if _fingers_blocked(scene, body, point, direction, z):
                gap = min(gap, 0.0)
            yaw = _yaw_for_closing_axis(direction, current_yaw)
            options.append(
                (gap >= FINGER_ROOM_RIM, _grasp_cost(scene, point, yaw), gap, point, yaw)
            )
        feasible = [o for o in options if o[0]]
        if feasible:
            _, _, _, point_xy, yaw = min(feasible, key=lambda o: o[1])
        else:
            _, _, _, point_xy, yaw = max(options, key=lambda o: o[2])
        return Grasp(pos=np.array([point_xy[0], point_xy[1], z]), yaw=yaw, approach_height=0.07)
    axes = _horizontal_axes(body)
    options = []
    for direction, extent in axes:
        # room beyond each side for an open finger; shift the grasp (within the finger's
        # slack around the object) away from a near neighbour
        plus = _clearance(body, direction) - extent / 2
        minus = _clearance(body, -direction) - extent / 2
        slack = max(0.0, GRIPPER_WIDTH_OPEN / 2 - extent / 2 - 0.004)
        shift = float(np.clip((plus - minus) / 2, -slack, slack))
        room = min(plus - shift, minus + shift)
        yaw = _yaw_for_closing_axis(direction, current_yaw)
        fits = extent <= MAX_GRASP_WIDTH
        cost = _grasp_cost(scene, center[:2], yaw)
        options.append((fits, room >= FINGER_ROOM_BOX, extent, cost, yaw, direction * shift))
    shift_xy = np.zeros(2)
    if not options:
        yaw = current_yaw
    else:
        narrowest = min(o[2] for o in options)
        # prefer: fits the gripper, room for the fingers, near-narrowest, then quickest
        _, _, _, _, yaw, shift_xy = min(
            options,
            key=lambda o: (not o[0], not o[1], o[2] > narrowest + 0.015, o[3]),
        )
    center = center.copy()
    center[:2] += shift_xy
    height = float(body.size[2])
    depth = min(0.03, height / 2.0 + 0.005)
    if options and not any(o[0] for o in options):
        depth = TOP_FEATURE_DEPTH  # too wide to span: grab the topmost feature (lid knob)
    z = max(body.top - depth, body.bottom + FINGERTIP_BELOW_EEF)
    return Grasp(pos=np.array([center[0], center[1], z]), yaw=yaw, approach_height=0.07)


@dataclass
class PlaceTarget:
    xy: np.ndarray
    surface_z: float  # where the held object's bottom should be released
    xy_tol: float


def plan_place_target(scene: Scene, relation: str, target_name: str, held: Body) -> PlaceTarget:
    """Release point for putting ``held`` on/in ``target_name`` (an object or a region site)."""
    if target_name in scene.bodies:
        target = scene.bodies[target_name]
        xy = target.center[:2] if "plate" not in target_name else target.pos[:2]
        surface = target.top + 0.01
        return PlaceTarget(xy=xy, surface_z=surface, xy_tol=0.012)
    if target_name in scene.sites:
        site = scene.sites[target_name]
        half = np.abs(site.xmat @ site.size)
        top = float(site.pos[2] + half[2])
        if relation == "in":
            surface = top + 0.01
            xy_tol = max(0.01, float(min(half[0], half[1])) - 0.035)
        else:
            surface = float(site.pos[2] + site.size[2]) + 0.01
            xy_tol = max(0.008, float(min(half[0], half[1])) * 0.4)
        preferred = _slot(scene, target_name, held.name, site.pos[:2], half[:2])
        xy = _free_spot(scene, site.pos[:2], half[:2], held, preferred)
        return PlaceTarget(xy=xy, surface_z=surface, xy_tol=xy_tol)
    raise ValueError(
        f"goal target {target_name!r} is neither an object nor a site in privileged_state "
        f"(objects: {sorted(scene.bodies)}, sites: {sorted(scene.sites)}); " + PRIVILEGED_STATE_HINT
    )


def _slot(
    scene: Scene, target_name: str, object_name: str, center: np.ndarray, half: np.ndarray
) -> np.ndarray:
    """Where in a region to put an object when several goal objects share it: side by side
    along the region's longer axis, in name order; the center otherwise."""
    sharing = sorted(
        {p[1] for p in scene.goal if len(p) == 3 and p[0] in ("on", "in") and p[2] == target_name}
    )
    if len(sharing) < 2 or object_name not in sharing:
        return center.copy()
    axis = 0 if half[0] >= half[1] else 1
    footprint = (
        float(scene.bodies[object_name].size[axis]) / 2 if object_name in scene.bodies else 0
    )
    reach = max(float(half[axis]) - max(SLOT_MARGIN, footprint + 0.005), 0.0)
    offsets = np.linspace(-reach, reach, len(sharing))
    point = center.copy()
    point[axis] += offsets[sharing.index(object_name)]
    return point


def _free_spot(
    scene: Scene, center: np.ndarray, half: np.ndarray, held: Body, preferred: np.ndarray
) -> np.ndarray:
    """A release point inside a region (center +- half) whose footprint keeps the most room
    (up to 3 cm) from the other movable objects already there; nearest ``preferred`` on
    ties."""
    footprint = held.size[:2] / 2
    others = [
        body
        for body in scene.bodies.values()
        if not body.fixture
        and body.name != held.name
        and np.all(body.bbox_max[:2] > center - half - 0.05)
        and np.all(body.bbox_min[:2] < center + half + 0.05)
    ]
    if not others:
        return preferred.copy()
    reach = np.maximum(half - np.minimum(footprint, half) * 0.5, 0.0)
    best, best_score = center.copy(), -np.inf
    for dx in np.linspace(-reach[0], reach[0], 9):
        for dy in np.linspace(-reach[1], reach[1], 9):
            point = center + np.array([dx, dy])
            room = min(
                _box_gap(point - footprint, point + footprint, body.bbox_min[:2], body.bbox_max[:2])
                for body in others
            )
            score = min(room, 0.03) - 0.05 * float(np.linalg.norm(point - preferred))
            if score > best_score:
                best, best_score = point, score
    return best


def _box_gap(low_a: np.ndarray, high_a: np.ndarray, low_b: np.ndarray, high_b: np.ndarray) -> float:
    """Distance between two axis-aligned rectangles (negative: overlap depth)."""
    gaps = np.maximum(low_b - high_a, low_a - high_b)
    if np.all(gaps < 0):
        return float(gaps.max())
    return float(np.linalg.norm(np.maximum(gaps, 0.0)))


def _transit(
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


def plan_pick_and_place(
    scene: Scene,
    relation: str,
    object_name: str,
    target_name: str,
    place: PlaceTarget | None = None,
) -> Plan:
    """Pick ``object_name`` and put it on/in ``target_name`` (or at ``place``)."""
    body = scene.body(object_name)
    eef = scene.eef_pos
    if body.grasped:
        if place is None:
            place = plan_place_target(scene, relation, target_name, body)
        below = float(eef[2] - body.bottom)
        # region predicates test the body origin, object targets the (box) center
        reference = body.pos[:2] if target_name in scene.sites else body.center[:2]
        carry_yaw, offset = _carry_yaw(
            scene, eef[:2] - reference, place.xy, place.surface_z + below, object_name
        )
        release = np.array(
            [place.xy[0] + offset[0], place.xy[1] + offset[1], place.surface_z + below]
        )
        xy_error = float(np.linalg.norm(reference - place.xy))
        if xy_error < place.xy_tol + 0.005 and body.bottom < place.surface_z + 0.015:
            up = eef + np.array([0.0, 0.0, 0.08])
            return Plan(
                [
                    Waypoint(pos=eef.copy(), gripper=GRIPPER_OPEN, hold=10, tol=1.0),
                    Waypoint(pos=up, gripper=GRIPPER_OPEN, tol=0.01),
                ],
                "release",
            )
        waypoints = []
        if xy_error > place.xy_tol:
            waypoints += _transit(
                scene,
                eef,
                release,
                exclude={object_name},
                extra_below=below,
                gripper=GRIPPER_CLOSE,
                yaw=carry_yaw,
            )
        waypoints.append(
            Waypoint(pos=release, gripper=GRIPPER_CLOSE, yaw=carry_yaw, tol=0.006, speed=0.6)
        )
        waypoints.append(Waypoint(pos=release, gripper=GRIPPER_OPEN, hold=10, tol=1.0))
        return Plan(waypoints, "carry")

    if place is None and _resting_on_target(scene, relation, body, target_name):
        up = eef + np.array([0.0, 0.0, 0.05])
        return Plan([Waypoint(pos=up, gripper=GRIPPER_OPEN, tol=0.01)], "settle")

    grasp = plan_grasp(scene, body)
    above = grasp.pos + np.array([0.0, 0.0, grasp.approach_height])
    xy_error = float(np.linalg.norm(eef[:2] - grasp.pos[:2]))
    in_column = xy_error < 0.03 and grasp.pos[2] - 0.012 < eef[2] < above[2] + 0.01
    at_grasp = xy_error < 0.015 and abs(eef[2] - grasp.pos[2]) < 0.012
    # Closing with zero deltas lets the arm drift up (nullspace pull to the home posture):
    # keep pressing a little below the grasp point while the fingers close.
    press = grasp.pos - np.array([0.0, 0.0, GRASP_PRESS_DEPTH])
    close = Waypoint(pos=press, gripper=GRIPPER_CLOSE, hold=16, tol=1.0)
    if at_grasp and scene.gripper_width > 0.008:
        return Plan([close], "close")
    if scene.gripper_width < GRIPPER_READY_WIDTH and eef[2] < grasp.pos[2] + 0.05:
        # A failed or interrupted grasp: open while backing up.
        up = eef + np.array([0.0, 0.0, 0.06])
        return Plan([Waypoint(pos=up, gripper=GRIPPER_OPEN, tol=0.01)], "regrasp")
    descend = Waypoint(
        pos=grasp.pos,
        gripper=GRIPPER_OPEN,
        yaw=grasp.yaw,
        tol=0.005,
        hold=2,
        speed=0.7,
        wait_for_open=True,
    )
    if in_column:
        return Plan([descend, close], "descend")
    waypoints = []
    if xy_error > 0.02:
        waypoints += _transit(
            scene,
            eef,
            above,
            exclude={object_name},
            extra_below=FINGERTIP_BELOW_EEF,
            gripper=GRIPPER_OPEN,
            yaw=grasp.yaw,
        )
    waypoints.append(Waypoint(pos=above, gripper=GRIPPER_OPEN, yaw=grasp.yaw, tol=0.01))
    waypoints += [descend, close]
    return Plan(waypoints, "approach")


def _carry_yaw(
    scene: Scene, offset: np.ndarray, place_xy: np.ndarray, release_z: float, held: str
) -> tuple[float, np.ndarray]:
    """Gripper yaw for carrying and releasing a held object (the smallest turn from now whose
    hand clears the bodies around the release point) and the end effector's xy offset from
    the object at that yaw (the object turns with the gripper)."""
    current = scene.eef_yaw
    for turn in (0.0, 0.4, -0.4, 0.8, -0.8, 1.2, -1.2, 1.6, -1.6):
        yaw = current + turn
        if abs(yaw) > math.pi / 2 + 0.05:
            continue
        c, s = math.cos(turn), math.sin(turn)
        turned = np.array([c * offset[0] - s * offset[1], s * offset[0] + c * offset[1]])
        if not _hand_blocked(scene, place_xy + turned, yaw, release_z, exclude={held}):
            return (None if turn == 0.0 else yaw), turned
    return None, offset


def _resting_on_target(scene: Scene, relation: str, body: Body, target_name: str) -> bool:
    """Whether the released object already lies on/in the target (the goal check may lag)."""
    if target_name in scene.sites:
        # LIBERO's own geometric tests on the body origin (contacts aside)
        site = scene.sites[target_name]
        if relation == "in":
            half = np.abs(site.xmat @ site.size)
            low = site.pos - half - np.array([0.0, 0.0, 0.01])
            return bool(np.all(body.pos > low) and np.all(body.pos < site.pos + half))
        offset = site.xmat @ (body.pos - site.pos)
        return bool(
            np.all(np.abs(offset[:2]) < site.size[:2])
            and site.size[2] - 0.005 < offset[2] < site.size[2] + 0.10
        )
    try:
        place = plan_place_target(scene, relation, target_name, body)
    except ValueError:
        return False
    xy_error = float(np.linalg.norm(body.center[:2] - place.xy))
    return xy_error < place.xy_tol + 0.01 and body.bottom < place.surface_z + 0.03


# --------------------------------------------------------------------------------------------
# Articulated parts: drawers, doors, knobs
# --------------------------------------------------------------------------------------------

_RANGE_KEYS = {
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
    values = scene.articulation.get(joint.owner, {}).get(_RANGE_KEYS[relation])
    if not values:
        raise NotImplementedError(f"{joint.owner} has no {_RANGE_KEYS[relation]} to {relation}")
    low, high = float(min(values)), float(max(values))
    margin = min((high - low) / 2, 0.15 if joint.type == "hinge" else 0.008)
    if abs(joint.qpos - low) <= abs(joint.qpos - high):
        return low + margin
    return high - margin


def joint_satisfied(scene: Scene, joint: Joint, relation: str) -> bool:
    """Whether the joint is already in the range for ``relation`` (as the goal check sees it)."""
    values = scene.articulation.get(joint.owner, {}).get(_RANGE_KEYS[relation])
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
        _yaw_for_closing_axis(np.array([-push.direction[1], push.direction[0]]), scene.eef_yaw)
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
    waypoints = []
    if float(np.linalg.norm(eef[:2] - push.start[:2])) > 0.02:
        waypoints += _transit(
            scene,
            eef,
            above,
            exclude=set(),
            extra_below=FINGERTIP_BELOW_EEF,
            gripper=GRIPPER_CLOSE,
            yaw=yaw,
        )
    waypoints.append(Waypoint(pos=above, gripper=GRIPPER_CLOSE, yaw=yaw, tol=0.01))
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
    across_yaw = _yaw_for_closing_axis(np.array([-direction[1], direction[0]]), scene.eef_yaw)
    along_yaw = _yaw_for_closing_axis(direction, scene.eef_yaw)
    yaw = across_yaw
    if abs(_wrap(along_yaw - scene.eef_yaw)) < abs(_wrap(across_yaw - scene.eef_yaw)) and not (
        _hand_blocked(scene, press[:2], along_yaw, handle[5] + FINGERTIP_BELOW_EEF)
    ):
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
    waypoints = []
    if float(np.linalg.norm(offset)) > 0.02:
        waypoints += _transit(
            scene,
            eef,
            above,
            exclude=set(),
            extra_below=FINGERTIP_BELOW_EEF,
            gripper=GRIPPER_CLOSE,
            yaw=yaw,
        )
    waypoints.append(Waypoint(pos=above, gripper=GRIPPER_CLOSE, yaw=yaw, tol=0.01))
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


def _hold_plan(scene: Scene, label: str) -> Plan:
    return Plan(
        [Waypoint(pos=scene.eef_pos.copy(), gripper=GRIPPER_OPEN, tol=1.0, hold=10**6)], label
    )


# --------------------------------------------------------------------------------------------
# Goal selection
# --------------------------------------------------------------------------------------------

_PREDICATE_ORDER = {"open": 0, "turnon": 1, "on": 2, "in": 2, "close": 3, "turnoff": 3}


def choose_subgoal(scene: Scene) -> list[str] | None:
    """The goal predicate to work on now (None when all hold): a held object's placement
    first, else ``open``/``turnon`` before ``on``/``in`` before ``close``/``turnoff``. Putting
    something into a closed drawer becomes ``["open", region]``, preceded by
    ``["relocate", object, joint]`` when the object is held or lies where the drawer opens."""
    pending = [
        predicate
        for predicate, done in zip(scene.goal, scene.goal_satisfied, strict=True)
        if not done
    ]
    if not pending:
        return None
    held = [
        p for p in pending if len(p) == 3 and p[1] in scene.bodies and scene.bodies[p[1]].grasped
    ]
    chosen = held[0] if held else min(pending, key=lambda p: _PREDICATE_ORDER.get(p[0], 9))
    if len(chosen) != 3 or chosen[0] not in ("on", "in"):
        return chosen
    site = scene.sites.get(chosen[2])
    if site is None or not site.joints or site.joints[0] not in scene.joints:
        return chosen
    joint = scene.joints[site.joints[0]]
    if _RANGE_KEYS["open"] not in scene.articulation.get(joint.owner, {}) or joint_satisfied(
        scene, joint, "open"
    ):
        return chosen
    body = scene.body(chosen[1])
    sweep = drawer_sweep(scene, joint)
    in_the_way = _box_gap(body.bbox_min[:2], body.bbox_max[:2], sweep[0], sweep[1]) < 0
    if body.grasped or in_the_way:
        return ["relocate", chosen[1], joint.name]
    return ["open", chosen[2]]


def drawer_sweep(scene: Scene, joint: Joint) -> tuple[np.ndarray, np.ndarray]:
    """The xy box the drawer and the gripper opening it will occupy (with a hand margin)."""
    target = joint_goal(scene, joint, "open")
    motion = joint.axis[:2] * (target - joint.qpos)
    low = np.minimum(joint.bbox_min[:2], joint.bbox_min[:2] + motion) - SWEEP_MARGIN
    high = np.maximum(joint.bbox_max[:2], joint.bbox_max[:2] + motion) + SWEEP_MARGIN
    return low, high


def relocation_spot(scene: Scene, body: Body, sweep: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A table spot near the drawer's sweep but out of it and clear of other objects, for an
    object that would be under the opened drawer (independent of where the object is now)."""
    half = body.size[:2] / 2
    resting = [b.bottom for b in scene.bodies.values() if not b.fixture and not b.grasped]
    table_z = min(resting) if resting else body.bottom
    # other objects and fixtures standing on the table (not the table itself)
    others = [
        b
        for b in scene.bodies.values()
        if b.name != body.name
        and (not b.fixture or b.top > table_z + 0.03)
        and not (b.fixture and b.bottom < table_z - 0.05)
    ]
    center = (sweep[0] + sweep[1]) / 2
    best, best_score = None, np.inf
    for x in np.arange(-0.3, 0.25, 0.02):
        for y in np.arange(-0.35, 0.35, 0.02):
            point = np.array([x, y])
            if _box_gap(point - half, point + half, sweep[0], sweep[1]) < 0.035:
                continue
            room = min(
                (
                    _box_gap(point - half, point + half, o.bbox_min[:2], o.bbox_max[:2])
                    for o in others
                ),
                default=1.0,
            )
            if room < 0.03:
                continue
            score = float(np.linalg.norm(point - center))
            if score < best_score:
                best, best_score = point, score
    return best if best is not None else body.center[:2].copy()


def plan(scene: Scene) -> Plan:
    subgoal = choose_subgoal(scene)
    if subgoal is None:
        # all goals hold: let go and stay clear above the goal objects (episodes may go on)
        names = {name for predicate in scene.goal for name in predicate[1:]}
        tops = [body.top for name, body in scene.bodies.items() if name in names]
        clear_z = (max(tops) if tops else scene.eef_pos[2]) + DONE_CLEARANCE
        hold = scene.eef_pos.copy()
        hold[2] = max(hold[2], clear_z)
        return Plan([Waypoint(pos=hold, gripper=GRIPPER_OPEN, tol=0.005, hold=10**6)], "done")
    relation = subgoal[0].lower()
    if relation == "relocate":
        body = scene.bodies[subgoal[1]]
        spot = relocation_spot(scene, body, drawer_sweep(scene, scene.joints[subgoal[2]]))
        resting = [b.bottom for b in scene.bodies.values() if not b.fixture and not b.grasped]
        table_z = min(resting) if resting else body.bottom
        place = PlaceTarget(xy=spot, surface_z=table_z + 0.01, xy_tol=0.015)
        return plan_pick_and_place(scene, "on", subgoal[1], "", place=place)
    if relation in ("on", "in") and len(subgoal) == 3:
        return plan_pick_and_place(scene, relation, subgoal[1], subgoal[2])
    if relation in _RANGE_KEYS and len(subgoal) == 2:
        return plan_articulation(scene, relation, subgoal[1])
    return _hold_plan(scene, f"unsupported: {subgoal}")


def expert_chunk(privileged_state: dict[str, Any], action_horizon: int) -> np.ndarray:
    """One LIBERO action chunk ``float64[action_horizon, 7]`` for the given privileged state."""
    scene = Scene.from_state(privileged_state)
    return track_waypoints(scene, plan(scene).waypoints, action_horizon)


class ScriptedExpertPolicy(ServerPolicy):
    """Stateless scripted expert; needs ``privileged_state`` in every request item."""

    name = "scripted"

    def act(self, items: list[PolicyItem], action_horizon: int) -> list[np.ndarray]:
        if action_horizon < 1:
            raise ValueError(f"action_horizon must be >= 1, got {action_horizon}")
        chunks = []
        for index, item in enumerate(items):
            if item.privileged_state is None:
                raise ValueError(
                    f"request item {index} has no privileged_state; " + PRIVILEGED_STATE_HINT
                )
            chunks.append(expert_chunk(item.privileged_state, action_horizon))
        return chunks
