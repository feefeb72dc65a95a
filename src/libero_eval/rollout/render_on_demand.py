"""Render on demand (docs/rfcs/0004-render-on-demand.md): a LIBERO env's cameras render only
for the control steps whose observation is sent to the policy or saved to a video.

robosuite samples a camera observable at the FIRST physics substep of a control step, and
keeps a sampling clock per observable. We leave the camera observables enabled (so their
clocks run exactly as with per-step rendering) and only make their sensor lazy: it renders
while the env's `RenderSwitch` is set and returns a placeholder otherwise. The images the
policy receives are therefore byte-identical to per-step rendering
(tests/test_render_on_demand.py proves it). This relies on robosuite 1.4.0 internals
(`Observable._sensor`, `_setup_observables`), which the project pins.

The cameras of one step render one after another and are read back from the GPU once
(`libero_eval.rollout.camera_readback`), where each env's first such read-back is byte-identical
to robosuite's own, camera by camera; otherwise robosuite renders them as it does.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from libero_eval.rollout.camera_readback import can_render_together, render_together

# robosuite's camera observables of a LIBERO env (`<camera>_image`)
CAMERAS = ("agentview", "robot0_eye_in_hand")

log = logging.getLogger(__name__)


class RenderSwitch:
    """Whether the env's cameras render now (set around a control step whose observation
    is sent or saved), and how many renders they made and in how many seconds (a render's
    wall time: on a GPU shared with a policy server it waits for the server's work).

    While it is set, the cameras' images of one physics state come from one read-back
    (`render`); `together` says whether that was checked equal to robosuite's own renders
    (None: not checked yet; False: robosuite renders each camera)."""

    def __init__(self) -> None:
        self._wanted = False
        self.renders = 0
        self.seconds = 0.0
        self.readbacks = 0  # reads of rendered images back from the GPU
        self.together: bool | None = None
        self._frames: dict[str, np.ndarray] = {}  # this state's images not yet taken
        self._frames_of: tuple | None = None  # (sim time, width, height) of _frames

    @property
    def wanted(self) -> bool:
        return self._wanted

    @wanted.setter
    def wanted(self, value: bool) -> None:
        self._wanted = value
        self._frames_of = None  # the next render reads back anew

    def render(self, sim, sensor, obs_cache):
        """Run robosuite's camera `sensor` with `sim.render` answered from this state's
        images, all cameras rendered and read back at once."""
        own_render = sim.render
        previous = vars(sim).get("render")

        def render(camera_name=None, width=None, height=None, depth=False, **kwargs):
            if depth or kwargs or camera_name not in CAMERAS:
                self.readbacks += 1
                return own_render(
                    camera_name=camera_name, width=width, height=height, depth=depth, **kwargs
                )
            return self._image(sim, own_render, camera_name, width, height)

        sim.render = render
        try:
            return sensor(obs_cache)
        finally:
            if previous is None:
                del sim.render
            else:
                sim.render = previous

    def _image(self, sim, own_render, camera: str, width: int, height: int) -> np.ndarray:
        state = (float(sim.data.time), width, height)
        if self._frames_of == state and camera in self._frames:
            return self._frames.pop(camera)
        if self.together is False or not can_render_together(sim, len(CAMERAS), width, height):
            self.readbacks += 1
            return own_render(camera_name=camera, width=width, height=height)
        self._frames = render_together(sim, CAMERAS, width, height)
        self._frames_of = state
        self.readbacks += 1
        if self.together is None:
            self._check(own_render, width, height)
        return self._frames.pop(camera)

    def _check(self, own_render, width: int, height: int) -> None:
        """Compare the first read-back with robosuite's own renders of the same state."""
        own = {c: own_render(camera_name=c, width=width, height=height) for c in CAMERAS}
        self.together = all(own[c].tobytes() == self._frames[c].tobytes() for c in CAMERAS)
        if not self.together:
            log.warning(
                "the cameras read back together differ from robosuite's own renders on this "
                "GL driver: rendering camera by camera, as robosuite does"
            )
            self._frames = own


class LazyCameraSensor:
    """A camera sensor that renders only while `switch.wanted` is set."""

    def __init__(self, sensor, switch: RenderSwitch, shape: tuple[int, int, int], env=None):
        """`env`: the robosuite env whose `sim` renders (its cameras then read back at once);
        None: the sensor renders as robosuite does."""
        self._sensor = sensor
        self._switch = switch
        self._env = env
        self._placeholder = np.zeros(shape, dtype=np.uint8)
        self.__modality__ = sensor.__modality__
        self.__name__ = getattr(sensor, "__name__", "camera_rgb")

    def __call__(self, obs_cache):
        if not self._switch.wanted:
            return self._placeholder
        started = time.perf_counter()
        if self._env is None:
            image = self._sensor(obs_cache)
        else:
            image = self._switch.render(self._env.sim, self._sensor, obs_cache)
        self._switch.renders += 1
        self._switch.seconds += time.perf_counter() - started
        return image


def install_lazy_cameras(env, switch: RenderSwitch, size: int) -> None:
    """Make the camera sensors of robosuite env `env` (LIBERO's, inside its `ControlEnv`)
    lazy, now and after every hard reset, which rebuilds them."""
    names = {f"{cam}_image" for cam in CAMERAS}

    def wrap(observables: dict) -> dict:
        for name in names & observables.keys():
            observable = observables[name]
            if not isinstance(observable._sensor, LazyCameraSensor):
                observable._sensor = LazyCameraSensor(
                    observable._sensor, switch, (size, size, 3), env
                )
        return observables

    wrap(env._observables)
    original_setup = env._setup_observables
    # Hard resets rebuild the sensors through _setup_observables: keep them lazy.
    env._setup_observables = lambda: wrap(original_setup())
