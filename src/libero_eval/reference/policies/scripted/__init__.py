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
translation and rotation within the q01..q99 range of the LIBERO action statistics the
package ships (``libero_eval:stats/libero_native_frame_wise_relative_rot6d.json``) so that the
round trip through a model's quantile normalization does not clip them.

The package follows the data flow of one query: ``scene`` (the privileged state as bodies,
sites and joints) -> ``policy`` (the goal predicate to work on) -> ``pick_place`` /
``articulated`` (the skill's waypoints; ``geometry`` for clearances and collisions) ->
``tracking`` (the open-loop chunk); ``robot`` holds the arm and gripper model they share.
"""

from __future__ import annotations

from libero_eval.reference.policies.scripted.policy import (
    ScriptedExpertPolicy,
    choose_subgoal,
    expert_chunk,
    plan,
)
from libero_eval.reference.policies.scripted.robot import (
    GRIPPER_CLOSE,
    GRIPPER_OPEN,
    ROTATION_ACTION_LIMIT,
    TRANSLATION_ACTION_HIGH,
    TRANSLATION_ACTION_LOW,
)
from libero_eval.reference.policies.scripted.scene import PRIVILEGED_STATE_HINT, Scene
from libero_eval.reference.policies.scripted.tracking import Plan, Waypoint, track_waypoints

__all__ = [
    "GRIPPER_CLOSE",
    "GRIPPER_OPEN",
    "PRIVILEGED_STATE_HINT",
    "ROTATION_ACTION_LIMIT",
    "TRANSLATION_ACTION_HIGH",
    "TRANSLATION_ACTION_LOW",
    "Plan",
    "Scene",
    "ScriptedExpertPolicy",
    "Waypoint",
    "choose_subgoal",
    "expert_chunk",
    "plan",
    "track_waypoints",
]
