"""An episode's scene is a function of the episode alone (real LIBERO).

LIBERO re-samples fixture placements (cabinets, stoves, ...) from numpy's global stream at
every reset, and `set_init_state` does not undo it. These tests run real LIBERO envs and check
that the first observation and the fixture positions of an episode do not depend on what the
env ran before, and that `reset_seeding: reference` reproduces a reference that seeds once
per task and runs its trials in order.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from libero_eval.rollout.env_worker import (  # noqa: E402
    SETTLE_ACTION,
    EnvSettings,
    EpisodeSpec,
    LiberoEpisodeEnv,
)
from libero_eval.rollout.protocols import get_protocol  # noqa: E402

pytestmark = pytest.mark.libero
SUITE = "libero_spatial"


def first_query(env: LiberoEpisodeEnv, spec: EpisodeSpec):
    observation = env.start_episode(spec)
    return observation, env.fixture_positions()


def assert_same_scene(a, b):
    (obs_a, fixtures_a), (obs_b, fixtures_b) = a, b
    assert fixtures_a.keys() == fixtures_b.keys() and fixtures_a
    for name in fixtures_a:
        np.testing.assert_array_equal(fixtures_a[name], fixtures_b[name], err_msg=name)
    np.testing.assert_array_equal(obs_a.agentview, obs_b.agentview)
    np.testing.assert_array_equal(obs_a.wrist, obs_b.wrist)


def test_an_episode_run_first_and_fifth_on_one_env_has_the_same_scene():
    env = LiberoEpisodeEnv(EnvSettings(), get_protocol("openpi", max_steps_override=16))
    try:
        episode = EpisodeSpec(SUITE, 0, 0)
        first = first_query(env, episode)
        # Three other episodes between, one of another task (the env is rebuilt), each stepped.
        for other in (EpisodeSpec(SUITE, 0, 1), EpisodeSpec(SUITE, 1, 0), EpisodeSpec(SUITE, 0, 2)):
            env.start_episode(other)
            env.step_chunk(np.tile([0.3, 0.0, 0.2, 0.0, 0.0, 0.0, 1.0], (5, 1)))
        fifth = first_query(env, episode)
        assert_same_scene(first, fifth)
        other_scene = first_query(env, EpisodeSpec(SUITE, 0, 1))[1]
        moved = [n for n in other_scene if not np.array_equal(other_scene[n], fifth[1][n])]
        assert moved, "another episode's reset stream should place the fixtures elsewhere"
    finally:
        env.close()


def test_reference_seeding_reproduces_seed_once_per_task_with_trials_in_order():
    protocol = get_protocol("openpi", max_steps_override=16)
    # openpi's loop: env.seed(7) once for the task, then trials 0, 1, 2 in order, each stepped.
    reference = LiberoEpisodeEnv(EnvSettings(render_mode="every_step"), protocol)
    ours = LiberoEpisodeEnv(EnvSettings(reset_seeding="reference"), protocol)
    try:
        reference._load(SUITE, 0)
        raw = reference._env
        raw.seed(protocol.seed)
        for trial in range(3):
            raw.reset()
            obs = raw.set_init_state(reference._init_states[trial])
            for _ in range(protocol.settle_steps):
                obs, _, _, _ = raw.step(SETTLE_ACTION)
            if trial < 2:
                for _ in range(8):
                    raw.step([0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 1.0])
        expected = reference.fixture_positions()

        observation, fixtures = first_query(ours, EpisodeSpec(SUITE, 0, 2))
        for name in expected:
            np.testing.assert_array_equal(fixtures[name], expected[name], err_msg=name)
        np.testing.assert_array_equal(observation.agentview, obs["agentview_image"])
        np.testing.assert_array_equal(observation.wrist, obs["robot0_eye_in_hand_image"])
    finally:
        reference.close()
        ours.close()
