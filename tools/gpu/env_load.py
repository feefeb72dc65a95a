"""A load of N LIBERO envs beside a server, to tell what slows it: their physics or their
rendering on the server's GPU.

Each process builds libero_spatial task 0 (256x256 cameras, an offscreen renderer), resets it,
then loops (resetting at the task's horizon): 5 control steps of physics, and with
``--render`` both cameras rendered once (the env workers' pattern with `render_mode:
on_demand` and openpi's 5 steps per chunk), until ``--seconds`` have passed since it was
ready. Prints one JSON line: chunks per second per env.

    MUJOCO_GL=egl MUJOCO_EGL_DEVICE_ID=0 \
        python tools/gpu/env_load.py --envs 16 --render --seconds 120
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from typing import Any


def env_process(
    ready: mp.Queue, done: mp.Queue, counter: Any, render: bool, seconds: float
) -> None:
    import numpy as np
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    suite = benchmark.get_benchmark_dict()["libero_spatial"]()
    task = suite.get_task(0)
    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    env = OffScreenRenderEnv(
        bddl_file_name=bddl, camera_heights=256, camera_widths=256, use_camera_obs=False
    )
    env.reset()
    ready.put(os.getpid())
    action = np.zeros(7)
    chunks, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(5):
            env.step(action)
            if env.env.done:  # the task's horizon: robosuite refuses a step after it
                env.reset()
        if render:
            for camera in ("agentview", "robot0_eye_in_hand"):
                env.sim.render(camera_name=camera, width=256, height=256)
        chunks += 1
        with counter.get_lock():
            counter.value += 1
    done.put(chunks / (time.perf_counter() - started))
    env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    ready, done, counter = ctx.Queue(), ctx.Queue(), ctx.Value("q", 0)
    procs = [
        ctx.Process(target=env_process, args=(ready, done, counter, args.render, args.seconds))
        for _ in range(args.envs)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get()
    print(json.dumps({"load": "ready", "envs": args.envs, "render": args.render}), flush=True)
    while any(proc.is_alive() for proc in procs) and done.qsize() < len(procs):
        print(json.dumps({"t": time.time(), "chunks": counter.value}), flush=True)
        time.sleep(1.0)
    rates = [done.get() for _ in procs]
    for proc in procs:
        proc.join()
    print(
        json.dumps(
            {
                "envs": args.envs,
                "render": args.render,
                "chunks_per_s_per_env": sum(rates) / len(rates),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
