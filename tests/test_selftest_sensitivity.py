"""The self-test catches what it claims to: each wrong convention drops the expert to failure.

The scripted expert answers in the model's output space (normalized rot6d, global_raw stats),
and its chunks come back through the client conversion. Here the conversion is deliberately
broken in one convention at a time, on an episode the expert solves with the right one.
The expert reads no images; the image conventions (180-degree flip, view order, padding) are
checked by the reference server against the raw camera frames (tests/test_pi05_reference.py)
and pinned by tests/test_actions.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from libero_eval.policy.families.cosmos3.actions import (
    libero_to_model_chunk,
    load_action_stats,
    model_chunk_to_libero,
    rot6d_to_matrix,
)
from libero_eval.reference.policies.base import PolicyItem
from libero_eval.reference.policies.scripted import ScriptedExpertPolicy
from libero_eval.rollout.libero_env import (
    EnvSettings,
    EpisodeOutcome,
    EpisodeSpec,
    LiberoEpisodeEnv,
)
from libero_eval.rollout.protocols import get_protocol
from libero_eval.settings_schema import build

pytestmark = pytest.mark.libero

STATS = (
    Path(__file__).resolve().parents[1]
    / "src/libero_eval/data/stats/libero_native_frame_wise_relative_rot6d.json"
)
RAW = load_action_stats(STATS, "global_raw")
GLOBAL = load_action_stats(STATS, "global")


def correct(model_chunk: np.ndarray) -> np.ndarray:
    return model_chunk_to_libero(model_chunk, RAW)


def transposed_rot6d(model_chunk: np.ndarray) -> np.ndarray:
    """Reads the 6 rot6d numbers as the first two ROWS of the rotation matrix."""
    actions = correct(model_chunk)
    denormalized = (model_chunk[:, :10] + 1) / 2 * (RAW.q99 - RAW.q01) + RAW.q01
    as_rows = np.swapaxes(rot6d_to_matrix(denormalized[:, 3:9]), -1, -2)
    actions[:, 3:6] = Rotation.from_matrix(as_rows).as_rotvec()
    return actions


def flipped_gripper(model_chunk: np.ndarray) -> np.ndarray:
    actions = correct(model_chunk)
    actions[:, 6] = -actions[:, 6]
    return actions


def global_block(model_chunk: np.ndarray) -> np.ndarray:
    """De-normalizes with `global` (identity rotation stats) instead of `global_raw`."""
    return model_chunk_to_libero(model_chunk, GLOBAL)


def run_expert_episode(convert) -> EpisodeOutcome:
    """libero_spatial task 0, init state 0, cosmos protocol, through `convert`."""
    protocol = get_protocol("cosmos")
    env = LiberoEpisodeEnv(build(EnvSettings, "rollout", send_privileged_state=True), protocol)
    expert = ScriptedExpertPolicy()
    try:
        result = env.start_episode(EpisodeSpec("libero_spatial", 0, 0))
        while not isinstance(result, EpisodeOutcome):
            item = PolicyItem(
                image=result.agentview,
                prompt=result.task_language,
                privileged_state=result.privileged_state,
            )
            libero_chunk = expert.act([item], action_horizon=16)[0]
            result = env.step_chunk(convert(libero_to_model_chunk(libero_chunk, RAW)))
        return result
    finally:
        env.close()


def test_expert_succeeds_through_the_right_conversion():
    assert run_expert_episode(correct).success_once


@pytest.mark.parametrize("convert", [transposed_rot6d, flipped_gripper, global_block])
def test_a_wrong_convention_makes_the_expert_fail(convert):
    assert not run_expert_episode(convert).success_once
