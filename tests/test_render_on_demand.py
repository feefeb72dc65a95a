"""Render on demand changes nothing the policy sees or does.

The same episodes (same init states, same seeded action chunks) run once with per-step camera
rendering (`render_mode="every_step"`, what every peer does) and once with the lazy camera
sensor (`render_mode="on_demand"`). At every policy query the observation images must be
byte-identical, the MuJoCo state identical, and each episode must end with the same outcome.
Video frames kept at a stride (rendered on demand at exactly those steps) must match as well.

This also guards the robosuite 1.4.0 internals the lazy sensor relies on
(`Observable._sensor`, `_setup_observables` on hard resets, the per-observable sampling clock):
if a robosuite upgrade changes them, these comparisons fail.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.libero

CHUNK = 16
MAX_STEPS = 32  # two chunks: one query after the settle steps, one after the first chunk
VIDEO_STRIDE = 8
# (suite, task_id, init states run back to back on one env: the second goes through a reset)
CASES = [
    ("libero_spatial", 0, (0, 1)),
    ("libero_object", 3, (2,)),
]


def _run_episodes(render_mode: str, suite: str, task_id: int, init_states: tuple[int, ...]):
    """Per episode: the queries' images and sim states, the kept video frames, the outcome."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero_eval.rollout.libero_env import (
        EnvSettings,
        EpisodeOutcome,
        EpisodeSpec,
        LiberoEpisodeEnv,
        seeded_action_chunks,
    )
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    env = LiberoEpisodeEnv(
        build(EnvSettings, "rollout", render_mode=render_mode, video_stride=VIDEO_STRIDE),
        get_protocol("rlinf", max_steps_override=MAX_STEPS, seed=1140),
    )
    episodes = []
    try:
        for init_state in init_states:
            queries = []
            observation = env.start_episode(EpisodeSpec(suite, task_id, init_state))
            queries.append((observation, env.sim_state()))
            result = None
            for chunk in seeded_action_chunks(
                seed=1000 * task_id + init_state, count=MAX_STEPS // CHUNK
            ):
                result = env.step_chunk(chunk)
                if isinstance(result, EpisodeOutcome):
                    break
                queries.append((result, env.sim_state()))
            assert isinstance(result, EpisodeOutcome), "the episode must end after max_steps"
            episodes.append(
                {
                    "queries": queries,
                    "final_state": env.sim_state(),
                    "outcome": result,
                    "renders": (env._switch.renders, env.render_seconds),
                    "readbacks": (env._switch.readbacks, env._switch.together),
                }
            )
    finally:
        env.close()
    return episodes


@pytest.mark.parametrize(("suite", "task_id", "init_states"), CASES)
def test_on_demand_rendering_matches_per_step_rendering(suite, task_id, init_states):
    every_step = _run_episodes("every_step", suite, task_id, init_states)
    on_demand = _run_episodes("on_demand", suite, task_id, init_states)

    assert len(every_step) == len(on_demand) == len(init_states)
    for init_state, reference, lazy in zip(init_states, every_step, on_demand, strict=True):
        where = f"{suite} task {task_id} init {init_state}"
        assert len(reference["queries"]) == len(lazy["queries"]) == MAX_STEPS // CHUNK
        for index, ((ref_obs, ref_state), (obs, state)) in enumerate(
            zip(reference["queries"], lazy["queries"], strict=True)
        ):
            query = f"{where}, query {index}"
            for camera in ("agentview", "wrist"):
                ref_image, image = getattr(ref_obs, camera), getattr(obs, camera)
                assert image.dtype == np.uint8 and image.shape == (256, 256, 3), query
                assert image.tobytes() == ref_image.tobytes(), f"{query}: {camera} differs"
                # A placeholder (all zeros) would also be identical to a missing render.
                assert image.any(), f"{query}: {camera} is blank"
            assert obs.task_language == ref_obs.task_language
            np.testing.assert_array_equal(state, ref_state, err_msg=f"{query}: sim state")
        np.testing.assert_array_equal(
            lazy["final_state"], reference["final_state"], err_msg=f"{where}: final sim state"
        )

        ref_outcome, outcome = reference["outcome"], lazy["outcome"]
        assert (
            outcome.success_once,
            outcome.success_at_end,
            outcome.first_success_step,
            outcome.steps,
        ) == (
            ref_outcome.success_once,
            ref_outcome.success_at_end,
            ref_outcome.first_success_step,
            ref_outcome.steps,
        ), f"{where}: outcome differs"
        assert outcome.steps == MAX_STEPS

        # Video frames: the settle frame plus every VIDEO_STRIDE-th policy step.
        assert len(outcome.frames) == len(ref_outcome.frames) == 1 + MAX_STEPS // VIDEO_STRIDE
        for number, (ref_frame, frame) in enumerate(
            zip(ref_outcome.frames, outcome.frames, strict=True)
        ):
            assert frame.tobytes() == ref_frame.tobytes(), f"{where}: video frame {number}"

        # The env counts its cameras' renders and their seconds (the dispatch log's split of an
        # env's query): on demand, the two cameras at the settle frame and at each video
        # frame's step (the second query's render is one of them), counted over the env's
        # episodes so far; rendering every step is not timed.
        renders, seconds = lazy["renders"]
        assert renders == 2 * (1 + MAX_STEPS // VIDEO_STRIDE) * (init_states.index(init_state) + 1)
        assert seconds > 0
        assert reference["renders"][1] is None
        # Both cameras of a step come from one read-back (camera_readback), checked equal to
        # robosuite's own renders at the env's first.
        assert lazy["readbacks"] == (renders // 2, True)


def test_cameras_read_back_unlike_robosuites_are_rendered_as_robosuite_does(monkeypatch, caplog):
    """Where the read-back of a step's cameras together differs from robosuite's own renders
    (here: the two images swapped), the env says so and renders camera by camera."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero_eval.rollout import render_on_demand
    from libero_eval.rollout.libero_env import EnvSettings, EpisodeSpec, LiberoEpisodeEnv
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    def first_query(render_mode: str):
        env = LiberoEpisodeEnv(
            build(EnvSettings, "rollout", render_mode=render_mode),
            get_protocol("rlinf", max_steps_override=CHUNK, seed=1140),
        )
        try:
            return env.start_episode(EpisodeSpec("libero_spatial", 0, 0)), env._switch
        finally:
            env.close()

    reference, _ = first_query("every_step")
    together = render_on_demand.render_together

    def swapped(sim, cameras, width, height):
        images = together(sim, cameras, width, height)
        return dict(zip(cameras, reversed([images[c] for c in cameras]), strict=True))

    monkeypatch.setattr(render_on_demand, "render_together", swapped)
    with caplog.at_level("WARNING", logger=render_on_demand.__name__):
        query, switch = first_query("on_demand")
    assert switch.together is False
    assert "differ from robosuite's own renders" in caplog.text
    for camera in ("agentview", "wrist"):
        assert getattr(query, camera).tobytes() == getattr(reference, camera).tobytes(), camera
    assert switch.readbacks == 1  # the read-back found unequal, then robosuite's own renders
