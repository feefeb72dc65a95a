"""Privileged simulator state for scripted experts.

`privileged_state(env, obs)` reads a LIBERO environment and returns a small JSON-serialisable
dict (lists of floats, strings, booleans; no images; about 5-20 kB as JSON) with everything
a scripted expert needs to plan: the robot end effector and gripper, every object's and
fixture's pose and axis-aligned collision bounding box, which objects the fingers touch
("grasped": both fingers do), free horizontal room around each movable object (ray casts),
the articulated joints (drawers, doors, knobs) with their world axes and moving-part boxes,
the BDDL regions (sites), and the task's goal predicates with their current truth values
(LIBERO's own predicate functions; evaluating them has no side effect beyond what every env
step already does).

Layout (all positions in metres, world frame; quaternions x, y, z, w):

    {
      "language": str,
      "goal": [["on", "akita_black_bowl_1", "plate_1"], ...],
      "goal_satisfied": [bool, ...],            # one per goal predicate
      "robot": {"eef_pos": [3], "eef_quat": [4], "gripper_qpos": [2],
                "eef_vel": [3], "eef_angvel": [3]},      # m/s, rad/s
      "objects": {name: {"pos": [3], "quat": [4], "bbox_min": [3], "bbox_max": [3],
                         "local_bbox_min": [3], "local_bbox_max": [3],  # body frame
                         "ray_clearance": [16],  # movable objects only, see ray_clearance
                         "fixture": bool, "grasped": bool, "touched": bool}},
      "joints": {joint: {"owner": str, "type": "slide" | "hinge", "qpos": float,
                         "axis": [3], "anchor": [3], "bbox_min": [3], "bbox_max": [3],
                         "geoms": [[min xyz, max xyz], ...]}},  # moving part, per geom
      "articulation": {owner: {"default_open_ranges": [..], ...}},
      "sites": {name: {"pos": [3], "xmat": [9], "size": [3], "parent": str | None,
                       "joints": [str]}},
    }
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np
from scipy.spatial.transform import Rotation

_JOINT_TYPE_NAMES = {2: "slide", 3: "hinge"}
RAY_DIRECTIONS = 16  # horizontal clearance rays per object, counter-clockwise from +x
RAY_MAX_DISTANCE = 0.25
_ROBOT_BODY_PREFIXES = ("robot0_", "gripper0_", "mount0_")


def _unwrap_libero_env(env: Any) -> Any:
    """Return the BDDL domain env (the one holding `parsed_problem`) inside LIBERO wrappers."""
    inner = env
    for _ in range(5):
        if hasattr(inner, "parsed_problem") and hasattr(inner, "object_states_dict"):
            return inner
        inner = getattr(inner, "env", None)
        if inner is None:
            break
    raise TypeError(
        f"privileged_state: env of type {type(env).__name__} is not a LIBERO environment "
        "(expected a libero ControlEnv/OffScreenRenderEnv or its BDDL domain env with "
        "`parsed_problem` and `object_states_dict`)"
    )


def _floats(values: Any) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=np.float64).ravel()]


class _GeometryIndex:
    """Collision-geom lookup for bounding boxes, cached per MuJoCo model."""

    def __init__(self, model: Any):
        self.model = model
        collides = (model.geom_contype != 0) | (model.geom_conaffinity != 0)
        self.collision_geoms = np.flatnonzero(collides)
        self.geom_body = model.geom_bodyid
        parents = model.body_parentid
        # subtree[b] = every body whose ancestor chain contains b
        self.subtree_geoms: dict[int, np.ndarray] = {}
        ancestors: list[set[int]] = []
        for body in range(model.nbody):
            chain = {body}
            parent = body
            while parent != 0:
                parent = int(parents[parent])
                chain.add(parent)
            ancestors.append(chain)
        self._ancestors = ancestors
        robot_bodies = {
            b
            for b in range(model.nbody)
            if (mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) or "").startswith(
                _ROBOT_BODY_PREFIXES
            )
        }
        self.robot_geoms = {g for g in range(model.ngeom) if int(self.geom_body[g]) in robot_bodies}

    def geoms_under(self, body_id: int) -> np.ndarray:
        if body_id not in self.subtree_geoms:
            mask = [
                body_id in self._ancestors[int(self.geom_body[g])] for g in self.collision_geoms
            ]
            self.subtree_geoms[body_id] = self.collision_geoms[np.asarray(mask, dtype=bool)]
        return self.subtree_geoms[body_id]

    def corners(self, data: Any, geoms: np.ndarray) -> np.ndarray | None:
        """World corners [N, 3] of the given geoms' own boxes, or None without geoms."""
        if len(geoms) == 0:
            return None
        aabb = np.asarray(self.model.geom_aabb)[geoms]  # center(3), half sizes(3), geom frame
        signs = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).T.reshape(-1, 3)
        corners_local = aabb[:, None, :3] + signs[None] * aabb[:, None, 3:]
        xmat = np.asarray(data.geom_xmat)[geoms].reshape(-1, 3, 3)
        xpos = np.asarray(data.geom_xpos)[geoms]
        corners = np.einsum("gij,gkj->gki", xmat, corners_local) + xpos[:, None, :]
        return corners.reshape(-1, 3)


def ray_clearance(
    geometry: _GeometryIndex, data: Any, body_id: int, origin: np.ndarray
) -> list[float]:
    """Free horizontal distance from ``origin`` to the nearest collision geom of anything but
    the body itself and the robot, along RAY_DIRECTIONS directions (capped at
    RAY_MAX_DISTANCE)."""
    model = geometry.model
    group = np.array([1, 0, 0, 0, 0, 0], dtype=np.uint8)  # collision geoms (group 0)
    hit = np.array([-1], dtype=np.int32)
    distances = []
    for k in range(RAY_DIRECTIONS):
        angle = 2 * np.pi * k / RAY_DIRECTIONS
        direction = np.array([np.cos(angle), np.sin(angle), 0.0])
        travelled = 0.0
        start = origin.astype(np.float64).copy()
        while True:
            distance = mujoco.mj_ray(model, data, start, direction, group, 1, body_id, hit)
            if distance < 0 or travelled + distance >= RAY_MAX_DISTANCE:
                travelled = RAY_MAX_DISTANCE
                break
            if int(hit[0]) not in geometry.robot_geoms:
                travelled += distance
                break
            travelled += distance + 1e-4
            start = start + direction * (distance + 1e-4)
        distances.append(min(travelled, RAY_MAX_DISTANCE))
    return distances


_GEOMETRY_CACHE: dict[int, _GeometryIndex] = {}


def _geometry(model: Any) -> _GeometryIndex:
    raw = getattr(model, "_model", model)
    key = id(raw)
    if key not in _GEOMETRY_CACHE:
        _GEOMETRY_CACHE.clear()
        _GEOMETRY_CACHE[key] = _GeometryIndex(raw)
    return _GEOMETRY_CACHE[key]


def _gripper_contacts(inner: Any) -> tuple[set[str], set[str]]:
    """Names of geoms touching the left and the right finger pad."""
    sim = inner.sim
    gripper = inner.robots[0].gripper
    left = set(gripper.important_geoms["left_fingerpad"]) | set(
        gripper.important_geoms["left_finger"]
    )
    right = set(gripper.important_geoms["right_fingerpad"]) | set(
        gripper.important_geoms["right_finger"]
    )
    touching_left: set[str] = set()
    touching_right: set[str] = set()
    for contact in sim.data.contact[: sim.data.ncon]:
        name1 = sim.model.geom_id2name(contact.geom1)
        name2 = sim.model.geom_id2name(contact.geom2)
        for own, other in ((name1, name2), (name2, name1)):
            if own in left:
                touching_left.add(other)
            elif own in right:
                touching_right.add(other)
    return touching_left, touching_right


def privileged_state(env: Any, obs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Snapshot of the simulator state a scripted expert plans from (see module docstring).

    `env` is a LIBERO env (ControlEnv / OffScreenRenderEnv or the BDDL domain env inside);
    `obs` is its latest observation dict, used for the `*_pos` / `*_quat` keys when present.
    """
    inner = _unwrap_libero_env(env)
    obs = obs or {}
    sim = inner.sim
    data = sim.data
    model = sim.model
    geometry = _geometry(model)
    raw_data = getattr(data, "_data", data)

    def obs_or(key: str, fallback: Any) -> list[float]:
        return _floats(obs[key]) if key in obs else _floats(fallback)

    goal = [[str(term) for term in predicate] for predicate in inner.parsed_problem["goal_state"]]
    goal_satisfied = [bool(inner._eval_predicate(predicate)) for predicate in goal]

    eef_site = inner.robots[0].eef_site_id
    eef_xmat = np.asarray(data.site_xmat[eef_site]).reshape(3, 3)
    robot = {
        "eef_pos": obs_or("robot0_eef_pos", data.site_xpos[eef_site]),
        "eef_quat": obs_or("robot0_eef_quat", Rotation.from_matrix(eef_xmat).as_quat()),
        "gripper_qpos": obs_or(
            "robot0_gripper_qpos",
            [data.qpos[i] for i in inner.robots[0]._ref_gripper_joint_pos_indexes],
        ),
        "eef_vel": _floats(data.get_site_xvelp(model.site_id2name(eef_site))),
        "eef_angvel": _floats(data.get_site_xvelr(model.site_id2name(eef_site))),
    }

    touching_left, touching_right = _gripper_contacts(inner)
    objects: dict[str, Any] = {}
    joints: dict[str, Any] = {}
    articulation: dict[str, Any] = {}
    for name, is_fixture in [(n, False) for n in inner.objects_dict] + [
        (n, True) for n in inner.fixtures_dict
    ]:
        mujoco_object = inner.get_object(name)
        body_id = inner.obj_body_id[name]
        xquat_wxyz = np.asarray(data.body_xquat[body_id])
        contact_geoms = set(mujoco_object.contact_geoms)
        entry: dict[str, Any] = {
            "pos": obs_or(f"{name}_pos", data.body_xpos[body_id]),
            "quat": obs_or(f"{name}_quat", np.roll(xquat_wxyz, -1)),
            "fixture": is_fixture,
            "grasped": bool(contact_geoms & touching_left and contact_geoms & touching_right),
            "touched": bool(contact_geoms & (touching_left | touching_right)),
        }
        corners = geometry.corners(raw_data, geometry.geoms_under(body_id))
        if corners is not None:
            entry["bbox_min"] = _floats(corners.min(axis=0))
            entry["bbox_max"] = _floats(corners.max(axis=0))
            # the same box in the body's own frame (extents along its axes)
            local = (corners - data.body_xpos[body_id]) @ np.asarray(
                data.body_xmat[body_id]
            ).reshape(3, 3)
            entry["local_bbox_min"] = _floats(local.min(axis=0))
            entry["local_bbox_max"] = _floats(local.max(axis=0))
            if not is_fixture:
                low, high = corners.min(axis=0), corners.max(axis=0)
                center = (low + high) / 2
                rays = []
                for depth in (0.008, 0.025, 0.04):
                    origin = np.array([center[0], center[1], max(high[2] - depth, low[2] + 0.004)])
                    rays.append(ray_clearance(geometry, raw_data, body_id, origin))
                entry["ray_clearance"] = _floats(np.min(rays, axis=0))
        objects[name] = entry

        properties = getattr(mujoco_object, "object_properties", None) or {}
        if properties.get("articulation"):
            articulation[name] = {
                key: _floats(value) for key, value in properties["articulation"].items()
            }
        for joint_name in getattr(mujoco_object, "joints", None) or []:
            joint_id = model.joint_name2id(joint_name)
            joint_type = _JOINT_TYPE_NAMES.get(int(model.jnt_type[joint_id]))
            if joint_type is None:
                continue  # free joints of movable objects are covered by pos/quat
            child_body = int(model.jnt_bodyid[joint_id])
            joint_entry: dict[str, Any] = {
                "owner": name,
                "type": joint_type,
                "qpos": float(data.qpos[model.jnt_qposadr[joint_id]]),
                "axis": _floats(data.xaxis[joint_id]),
                "anchor": _floats(data.xanchor[joint_id]),
            }
            part_geoms = geometry.geoms_under(child_body)
            part = geometry.corners(raw_data, part_geoms)
            if part is not None:
                joint_entry["bbox_min"] = _floats(part.min(axis=0))
                joint_entry["bbox_max"] = _floats(part.max(axis=0))
                boxes = part.reshape(len(part_geoms), 8, 3)
                joint_entry["geoms"] = [
                    _floats(np.concatenate([box.min(axis=0), box.max(axis=0)])) for box in boxes
                ]
            joints[joint_name] = joint_entry

    sites: dict[str, Any] = {}
    for name, site in inner.object_sites_dict.items():
        try:
            site_id = model.site_name2id(name)
        except ValueError:
            continue
        sites[name] = {
            "pos": _floats(data.site_xpos[site_id]),
            "xmat": _floats(data.site_xmat[site_id]),
            "size": _floats(site.size) if site.size is not None else [0.0, 0.0, 0.0],
            "parent": site.parent_name,
            "joints": [str(j) for j in (site.joints or [])],
        }

    return {
        "language": _language(inner.parsed_problem.get("language_instruction", "")),
        "goal": goal,
        "goal_satisfied": goal_satisfied,
        "robot": robot,
        "objects": objects,
        "joints": joints,
        "articulation": articulation,
        "sites": sites,
    }


def _language(instruction: Any) -> str:
    """The BDDL language instruction (parsed as a list of words) as one string."""
    if isinstance(instruction, list | tuple):
        return " ".join(str(word) for word in instruction)
    return str(instruction)
