"""Pick-and-place (``on``, ``in``): top-down and rim grasps with room for the fingers, the
release point on an object or in a region, and the carry there over obstacles."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from libero_eval.reference.policies.scripted.geometry import (
    box_gap,
    hand_blocked,
    horizontal_axes,
    transit,
)
from libero_eval.reference.policies.scripted.robot import (
    FINGERTIP_BELOW_EEF,
    GRIPPER_CLOSE,
    GRIPPER_OPEN,
    GRIPPER_READY_WIDTH,
    GRIPPER_WIDTH_OPEN,
    HAND_BOTTOM_ABOVE_EEF,
    HAND_HALF_LENGTH,
    HAND_HALF_THICKNESS,
    MAX_GRASP_WIDTH,
    METRES_PER_STEP_PER_ACTION,
    RADIANS_PER_STEP_PER_ACTION,
    ROTATION_ACTION_LIMIT,
    TRANSLATION_ACTION_HIGH,
)
from libero_eval.reference.policies.scripted.scene import (
    PRIVILEGED_STATE_HINT,
    Body,
    Scene,
    wrap_angle,
    yaw_for_closing_axis,
)
from libero_eval.reference.policies.scripted.tracking import Plan, Waypoint

SLOT_MARGIN = 0.03  # object centers this far inside a shared region's edge
TOP_FEATURE_DEPTH = 0.006
RIM_GRASP_NAMES = ("bowl", "mug", "cup", "plate")
RIM_GRASP_DIRECTIONS = 16
RIM_INSET = 0.012  # grasp point inside the outer rim
RIM_GRASP_DEPTH = 0.022  # end effector below the rim top
GRASP_PRESS_DEPTH = 0.01  # keep commanding this far below the grasp point while closing
FINGER_ROOM_RIM = 0.042  # free space needed beyond the rim for the outer finger
FINGER_ROOM_BOX = 0.03  # free space needed on both sides of a box-like object


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


def _grasp_cost(scene: Scene, point_xy: np.ndarray, yaw: float) -> float:
    """Approximate steps to reach a grasp: translation and rotation run in parallel."""
    travel = float(np.linalg.norm(point_xy - scene.eef_pos[:2]))
    turn = abs(wrap_angle(yaw - scene.eef_yaw))
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
            yaw = yaw_for_closing_axis(direction, current_yaw)
            options.append(
                (gap >= FINGER_ROOM_RIM, _grasp_cost(scene, point, yaw), gap, point, yaw)
            )
        feasible = [o for o in options if o[0]]
        if feasible:
            _, _, _, point_xy, yaw = min(feasible, key=lambda o: o[1])
        else:
            _, _, _, point_xy, yaw = max(options, key=lambda o: o[2])
        return Grasp(pos=np.array([point_xy[0], point_xy[1], z]), yaw=yaw, approach_height=0.07)
    axes = horizontal_axes(body)
    options = []
    for direction, extent in axes:
        # room beyond each side for an open finger; shift the grasp (within the finger's
        # slack around the object) away from a near neighbour
        plus = _clearance(body, direction) - extent / 2
        minus = _clearance(body, -direction) - extent / 2
        slack = max(0.0, GRIPPER_WIDTH_OPEN / 2 - extent / 2 - 0.004)
        shift = float(np.clip((plus - minus) / 2, -slack, slack))
        room = min(plus - shift, minus + shift)
        yaw = yaw_for_closing_axis(direction, current_yaw)
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
                box_gap(point - footprint, point + footprint, body.bbox_min[:2], body.bbox_max[:2])
                for body in others
            )
            score = min(room, 0.03) - 0.05 * float(np.linalg.norm(point - preferred))
            if score > best_score:
                best, best_score = point, score
    return best


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
            waypoints += transit(
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
        waypoints += transit(
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
        if not hand_blocked(scene, place_xy + turned, yaw, release_z, exclude={held}):
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
