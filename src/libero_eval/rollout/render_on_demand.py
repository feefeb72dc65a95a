"""Render on demand (docs/rfcs/0004-render-on-demand.md): a LIBERO env's cameras render only
for the control steps whose observation is sent to the policy or saved to a video.

robosuite samples a camera observable at the FIRST physics substep of a control step, and
keeps a sampling clock per observable. We leave the camera observables enabled (so their
clocks run exactly as with per-step rendering) and only make their sensor lazy: it renders
while the env's `RenderSwitch` is set and returns a placeholder otherwise. The images the
policy receives are therefore byte-identical to per-step rendering
(tests/test_render_on_demand.py proves it). This relies on robosuite 1.4.0 internals
(`Observable._sensor`, `_setup_observables`), which the project pins.
"""

from __future__ import annotations

import time

import numpy as np

# robosuite's camera observables of a LIBERO env (`<camera>_image`)
CAMERAS = ("agentview", "robot0_eye_in_hand")


class RenderSwitch:
    """Whether the env's cameras render now (set around a control step whose observation
    is sent or saved), and how many renders they made and in how many seconds (a render's
    wall time: on a GPU shared with a policy server it waits for the server's work)."""

    def __init__(self) -> None:
        self.wanted = False
        self.renders = 0
        self.seconds = 0.0


class LazyCameraSensor:
    """A camera sensor that renders only while `switch.wanted` is set."""

    def __init__(self, sensor, switch: RenderSwitch, shape: tuple[int, int, int]):
        self._sensor = sensor
        self._switch = switch
        self._placeholder = np.zeros(shape, dtype=np.uint8)
        self.__modality__ = sensor.__modality__
        self.__name__ = getattr(sensor, "__name__", "camera_rgb")

    def __call__(self, obs_cache):
        if not self._switch.wanted:
            return self._placeholder
        started = time.perf_counter()
        image = self._sensor(obs_cache)
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
                observable._sensor = LazyCameraSensor(observable._sensor, switch, (size, size, 3))
        return observables

    wrap(env._observables)
    original_setup = env._setup_observables
    # Hard resets rebuild the sensors through _setup_observables: keep them lazy.
    env._setup_observables = lambda: wrap(original_setup())
