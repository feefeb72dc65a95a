"""The scripted expert: plans LIBERO skills from privileged state, stateless, encodable actions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from libero_eval.policy.families.cosmos3.actions import (
    libero_to_model_chunk,
    load_action_stats,
    model_chunk_to_libero,
)
from libero_eval.reference.policies.base import PolicyItem
from libero_eval.reference.policies.scripted import (
    GRIPPER_CLOSE,
    GRIPPER_OPEN,
    ROTATION_ACTION_LIMIT,
    TRANSLATION_ACTION_HIGH,
    TRANSLATION_ACTION_LOW,
    ScriptedExpertPolicy,
)

STATS_PATH = (
    Path(__file__).resolve().parents[1]
    / "src"
    / "libero_eval"
    / "data"
    / "stats"
    / "libero_native_frame_wise_relative_rot6d.json"
)
IMAGE = np.zeros((8, 8, 3), dtype=np.uint8)


def _item(state: dict | None) -> PolicyItem:
    return PolicyItem(image=IMAGE, prompt="pick up the bowl", privileged_state=state)


def _tabletop_state(eef: list[float], bowl_grasped: bool = False) -> dict:
    """A minimal privileged state: a bowl to put on a plate, nothing else on the table."""

    def body(center: list[float], half: list[float], grasped: bool = False) -> dict:
        low = [c - h for c, h in zip(center, half, strict=True)]
        high = [c + h for c, h in zip(center, half, strict=True)]
        return {
            "pos": [center[0], center[1], low[2]],
            "quat": [0.0, 0.0, 0.0, 1.0],
            "bbox_min": low,
            "bbox_max": high,
            "local_bbox_min": [-h for h in half],
            "local_bbox_max": list(half),
            "fixture": False,
            "grasped": grasped,
            "touched": grasped,
            "ray_clearance": [0.25] * 16,
        }

    return {
        "language": "put the bowl on the plate",
        "goal": [["on", "akita_black_bowl_1", "plate_1"]],
        "goal_satisfied": [False],
        "robot": {
            "eef_pos": eef,
            "eef_quat": [1.0, 0.0, 0.0, 0.0],  # gripper pointing down
            "gripper_qpos": [0.01, -0.01] if bowl_grasped else [0.039, -0.039],
            "eef_vel": [0.0, 0.0, 0.0],
            "eef_angvel": [0.0, 0.0, 0.0],
        },
        "objects": {
            "akita_black_bowl_1": body([0.0, 0.1, 0.925], [0.053, 0.053, 0.025], bowl_grasped),
            "plate_1": body([0.05, -0.15, 0.908], [0.07, 0.07, 0.009]),
        },
        "joints": {},
        "articulation": {},
        "sites": {},
    }


def test_expert_refuses_an_item_without_privileged_state_and_says_how_to_enable_it():
    with pytest.raises(ValueError, match=r"item 0 has no privileged_state.*send_privileged_state"):
        ScriptedExpertPolicy().act([_item(None)], action_horizon=16)


def test_expert_rejects_a_privileged_state_without_the_robot_and_names_the_fields():
    state = _tabletop_state([-0.2, 0.0, 1.17])
    del state["robot"]
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['robot'\]"):
        ScriptedExpertPolicy().act([_item(state)], action_horizon=16)


@pytest.mark.parametrize("grasped", [False, True])
def test_expert_chunks_have_binary_gripper_and_actions_inside_the_encodable_range(grasped):
    eef = [0.0, 0.1, 1.0] if grasped else [-0.2, 0.0, 1.17]
    chunk = ScriptedExpertPolicy().act([_item(_tabletop_state(eef, grasped))], 16)[0]
    assert chunk.shape == (16, 7)
    assert set(np.unique(chunk[:, 6])) <= {GRIPPER_OPEN, GRIPPER_CLOSE}
    assert np.all(chunk[:, :3] >= TRANSLATION_ACTION_LOW - 1e-9)
    assert np.all(chunk[:, :3] <= TRANSLATION_ACTION_HIGH + 1e-9)
    assert np.all(np.abs(chunk[:, 3:6]) <= ROTATION_ACTION_LIMIT + 1e-9)
    assert np.abs(chunk[:, :3]).max() > 0.1, "the expert should be moving toward its target"


def test_expert_heads_for_the_bowl_when_empty_handed_and_for_the_plate_when_holding_it():
    policy = ScriptedExpertPolicy()
    approach = policy.act([_item(_tabletop_state([-0.2, 0.0, 1.17]))], 16)[0]
    carry = policy.act([_item(_tabletop_state([0.0, 0.1, 1.0], bowl_grasped=True))], 16)[0]
    approach_motion = approach[:, :3].sum(axis=0)
    carry_motion = carry[:, :3].sum(axis=0)
    assert approach_motion[0] > 0 and approach_motion[1] > 0  # toward the bowl at +x, +y
    assert np.all(approach[:, 6] == GRIPPER_OPEN)
    assert carry_motion[1] < 0  # toward the plate at -y
    assert carry[0, 6] == GRIPPER_CLOSE


def test_expert_is_stateless_the_same_state_gives_the_same_chunk():
    policy = ScriptedExpertPolicy()
    state = _tabletop_state([-0.2, 0.0, 1.17])
    first = policy.act([_item(state)], 16)[0]
    policy.act([_item(_tabletop_state([0.0, 0.1, 1.0], bowl_grasped=True))], 16)
    again = policy.act([_item(state)], 16)[0]
    np.testing.assert_array_equal(first, again)


def test_expert_chunks_survive_the_cosmos3_action_encoding_round_trip():
    stats = load_action_stats(STATS_PATH, "global_raw")
    for state in (
        _tabletop_state([-0.2, 0.0, 1.17]),
        _tabletop_state([0.0, 0.1, 1.0], bowl_grasped=True),
    ):
        chunk = ScriptedExpertPolicy().act([_item(state)], 16)[0]
        back = model_chunk_to_libero(libero_to_model_chunk(chunk, stats), stats, 10, 16)
        np.testing.assert_allclose(back[:, :6], chunk[:, :6], atol=2e-3)
        np.testing.assert_array_equal(back[:, 6], chunk[:, 6])


# --------------------------------------------------------------------------------------------
# Real LIBERO physics
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spatial_task0_env():
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero_eval.rollout.libero_env import physics_only_env, task_bddl_and_language

    _bddl, language, init_states = task_bddl_and_language("libero_spatial", 0)
    env = physics_only_env("libero_spatial", 0)
    yield env, init_states[0], language
    env.close()


@pytest.mark.libero
def test_privileged_state_is_small_json_with_the_bddl_goal(spatial_task0_env):
    from libero_eval.rollout.privileged import privileged_state

    env, init_state, _ = spatial_task0_env
    env.seed(0)
    env.reset()
    obs = env.set_init_state(init_state)
    state = privileged_state(env, obs)
    encoded = json.dumps(state)
    assert len(encoded) < 50_000
    assert state["goal"] == [["on", "akita_black_bowl_1", "plate_1"]]
    assert state["goal_satisfied"] == [False]
    assert state["language"].startswith("pick")
    np.testing.assert_allclose(state["robot"]["eef_pos"], obs["robot0_eef_pos"])
    bowl = state["objects"]["akita_black_bowl_1"]
    np.testing.assert_allclose(bowl["pos"], obs["akita_black_bowl_1_pos"])
    assert all(lo < hi for lo, hi in zip(bowl["bbox_min"], bowl["bbox_max"], strict=True))
    assert not bowl["grasped"] and not bowl["fixture"]
    assert state["objects"]["wooden_cabinet_1"]["fixture"]
    assert "wooden_cabinet_1_top_level" in state["joints"]


@pytest.mark.libero
def test_expert_solves_spatial_task0_init0_through_the_encoding_round_trip(spatial_task0_env):
    from libero_eval.rollout.privileged import privileged_state

    env, init_state, language = spatial_task0_env
    stats = load_action_stats(STATS_PATH, "global_raw")
    policy = ScriptedExpertPolicy()
    env.seed(0)
    env.reset()
    obs = env.set_init_state(init_state)
    for _ in range(10):  # the cosmos protocol's wait steps
        obs, _, _, _ = env.step(np.array([0, 0, 0, 0, 0, 0, GRIPPER_OPEN]))
    steps, done = 0, False
    while steps < 230 and not done:
        state = json.loads(json.dumps(privileged_state(env, obs)))
        item = PolicyItem(image=IMAGE, prompt=language, privileged_state=state)
        chunk = policy.act([item], 16)[0]
        for action in model_chunk_to_libero(libero_to_model_chunk(chunk, stats), stats, 10, 16):
            obs, _, done, _ = env.step(action)
            steps += 1
            if done or steps >= 230:
                break
    assert done, f"the bowl is not on the plate after {steps} steps"
    assert env.check_success()
