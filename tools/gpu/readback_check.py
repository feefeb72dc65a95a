"""Whether the cameras read back together (`libero_eval.rollout.camera_readback`) equal
robosuite's own renders, camera by camera, on this node's GL driver, and what each takes.

One LIBERO env (libero_spatial task 0, 256x256, the env workers' settings), stepped with random
actions; after each step both cameras are rendered both ways and compared byte for byte.

    MUJOCO_GL=egl PYOPENGL_PLATFORM=egl MUJOCO_EGL_DEVICE_ID=0 \
        python tools/gpu/readback_check.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    import numpy as np
    from libero.libero.envs import OffScreenRenderEnv
    from OpenGL import GL

    from libero_eval.rollout.camera_readback import can_render_together, render_together
    from libero_eval.rollout.libero_env import task_bddl_and_language
    from libero_eval.rollout.render_on_demand import CAMERAS

    bddl, _, _ = task_bddl_and_language("libero_spatial", 0)
    env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=256, camera_widths=256)
    env.reset()
    sim, rng = env.sim, np.random.default_rng(0)
    equal, own_s, together_s = 0, 0.0, 0.0
    for _ in range(args.steps):
        env.step(rng.uniform(-1, 1, 7))
        started = time.perf_counter()
        own = {c: sim.render(camera_name=c, width=256, height=256) for c in CAMERAS}
        own_s += time.perf_counter() - started
        started = time.perf_counter()
        together = render_together(sim, CAMERAS, 256, 256)
        together_s += time.perf_counter() - started
        equal += all(own[c].tobytes() == together[c].tobytes() for c in CAMERAS)
    print(
        json.dumps(
            {
                "renderer": GL.glGetString(GL.GL_RENDERER).decode(),
                "can_render_together": can_render_together(sim, len(CAMERAS), 256, 256),
                "steps": args.steps,
                "equal_steps": equal,
                "ms_camera_by_camera": round(own_s * 1000 / args.steps, 2),
                "ms_together": round(together_s * 1000 / args.steps, 2),
            }
        )
    )
    env.close()


if __name__ == "__main__":
    main()
