"""Goal selection and the ``ScriptedExpertPolicy``: the goal predicate to work on now, the
skill plan for it, and the chunk that tracks the plan's waypoints."""

from __future__ import annotations

from typing import Any

import numpy as np

from libero_eval.reference.policies.base import PolicyItem, ServerPolicy
from libero_eval.reference.policies.scripted.articulated import (
    RANGE_KEYS,
    joint_goal,
    joint_satisfied,
    plan_articulation,
)
from libero_eval.reference.policies.scripted.geometry import box_gap
from libero_eval.reference.policies.scripted.pick_place import PlaceTarget, plan_pick_and_place
from libero_eval.reference.policies.scripted.robot import GRIPPER_OPEN
from libero_eval.reference.policies.scripted.scene import PRIVILEGED_STATE_HINT, Body, Joint, Scene
from libero_eval.reference.policies.scripted.tracking import Plan, Waypoint, track_waypoints

SWEEP_MARGIN = 0.06  # clearance kept from an opening drawer's path (the hand's half width)
DONE_CLEARANCE = 0.08  # once done, keep the gripper this far above the goal objects


def _hold_plan(scene: Scene, label: str) -> Plan:
    return Plan(
        [Waypoint(pos=scene.eef_pos.copy(), gripper=GRIPPER_OPEN, tol=1.0, hold=10**6)], label
    )


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
    if RANGE_KEYS["open"] not in scene.articulation.get(joint.owner, {}) or joint_satisfied(
        scene, joint, "open"
    ):
        return chosen
    body = scene.body(chosen[1])
    sweep = drawer_sweep(scene, joint)
    in_the_way = box_gap(body.bbox_min[:2], body.bbox_max[:2], sweep[0], sweep[1]) < 0
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
            if box_gap(point - half, point + half, sweep[0], sweep[1]) < 0.035:
                continue
            room = min(
                (
                    box_gap(point - half, point + half, o.bbox_min[:2], o.bbox_max[:2])
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
    if relation in RANGE_KEYS and len(subgoal) == 2:
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
