"""Where a real LIBERO env renders, and what GPU memory its renderer takes.

Starts N processes; each builds LIBERO's `OffScreenRenderEnv` (libero_spatial task 0, 256x256,
the way the env workers do), resets it and steps it with both cameras rendered, then reports
the GL vendor and renderer of robosuite's EGL context. The parent reads the GPU's used memory
(NVML) before the envs start, while all of them hold their contexts, and lists the processes
NVML attributes GPU memory to (compute and graphics).

    MUJOCO_GL=egl PYOPENGL_PLATFORM=egl MUJOCO_EGL_DEVICE_ID=0 CUDA_VISIBLE_DEVICES=0 \
        python tools/gpu/render_probe.py --envs 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time


def env_process(ready: mp.Queue, release: mp.Event, steps: int) -> None:
    """Build, reset and step one env; report its GL strings; hold the context until released."""
    import numpy as np
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv
    from OpenGL import GL

    suite = benchmark.get_benchmark_dict()["libero_spatial"]()
    bddl = os.path.join(
        get_libero_path("bddl_files"), suite.get_task(0).problem_folder, suite.get_task(0).bddl_file
    )
    env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=256, camera_widths=256)
    env.reset()
    t0 = time.perf_counter()
    for _ in range(steps):
        obs, *_ = env.step(np.zeros(7))
    ms = (time.perf_counter() - t0) * 1000 / steps
    ctx = env.sim._render_context_offscreen.gl_ctx
    ctx.make_current()
    ready.put(
        {
            "pid": os.getpid(),
            "vendor": GL.glGetString(GL.GL_VENDOR).decode(),
            "renderer": GL.glGetString(GL.GL_RENDERER).decode(),
            "image_mean": float(obs["agentview_image"].mean()),
            "ms_per_step": round(ms, 1),
        }
    )
    release.wait(120)
    env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    try:
        import pynvml

        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:  # no NVIDIA GPU here: report the GL strings only
        print(f"NVML unavailable ({exc}): no GPU memory figures")
        gpu = None

    def used_mib() -> int:
        return round(pynvml.nvmlDeviceGetMemoryInfo(gpu).used / 2**20) if gpu else 0

    def processes() -> list[dict]:
        found: list[dict] = []
        if gpu is None:
            return found
        for kind, query in (
            ("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for p in query(gpu):
                found.append(
                    {"kind": kind, "pid": p.pid, "mib": round((p.usedGpuMemory or 0) / 2**20)}
                )
        return found

    before = used_mib()
    context = mp.get_context("spawn")
    ready, release = context.Queue(), context.Event()
    procs = [
        context.Process(target=env_process, args=(ready, release, args.steps))
        for _ in range(args.envs)
    ]
    for p in procs:
        p.start()
    reports = [ready.get(timeout=300) for _ in procs]
    held = used_mib()
    listed = processes()
    release.set()
    for p in procs:
        p.join(60)
    print(
        json.dumps(
            {
                "envs": args.envs,
                "used_mib_before": before,
                "used_mib_while_held": held,
                "mib_per_env": round((held - before) / args.envs, 1),
                "nvml_processes": listed,
                "envs_report": reports,
                "MUJOCO_EGL_DEVICE_ID": os.environ.get("MUJOCO_EGL_DEVICE_ID"),
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
