"""Memory and time of the env workers' renderers: host RSS and GPU memory per env, and where
each env renders (`rollout.render_device`).

Each env is a process that opens one MuJoCo EGL context, the way robosuite's offscreen
renderer does (`MUJOCO_GL=egl`, `MUJOCO_EGL_DEVICE_ID`), on a LIBERO scene, and renders its two
cameras (agentview, robot0_eye_in_hand) at --size every step. The scene is either built from
LIBERO (`--suite/--task`, needs the project's environment) or loaded from a compiled MuJoCo
model file (`--scene scene.mjb`) made here with `--export-scene`, so that it can be measured on
a GPU machine without LIBERO installed. A compiled model holds the meshes and textures that
the renderer uploads, so the GPU memory is that of the LIBERO scene; only robosuite's Python
objects are missing from the host figure (see docs/performance.md for the full-env RSS).

    python benchmarks/egl_memory.py --export-scene /tmp/libero_spatial_t0.mjb
    python benchmarks/egl_memory.py --scene /tmp/libero_spatial_t0.mjb --envs 1,4,16 \
        --render-device slot_gpu --gpu 0

Prints a Markdown table and, with --json, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))

CAMERAS = ("agentview", "robot0_eye_in_hand")


def export_scene(path: Path, suite: str, task_id: int, size: int) -> None:
    """Build the LIBERO env and save its compiled MuJoCo model (meshes and textures inside)."""
    import mujoco
    from libero.libero.envs import OffScreenRenderEnv

    from libero_eval.rollout.libero_env import task_bddl_and_language

    bddl, language, _ = task_bddl_and_language(suite, task_id)
    env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=size, camera_widths=size)
    env.reset()
    model = env.sim.model._model
    path.parent.mkdir(parents=True, exist_ok=True)
    mujoco.mj_saveModel(model, str(path), None)
    print(
        f"saved {suite} task {task_id} ({language}) to {path}: {path.stat().st_size / 2**20:.1f} "
        f"MiB, {model.nmesh} meshes, {model.ntex} textures, offscreen buffer "
        f"{model.vis.global_.offwidth}x{model.vis.global_.offheight}"
    )
    env.close()


def gpu_used_mib(index: int) -> float | None:
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "-i",
                str(index),
                "--query-gpu=memory.used",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def per_process_gpu_mib(index: int) -> dict[int, float]:
    """Per-process GPU memory from NVML (graphics and compute processes), where available."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        found: dict[int, float] = {}
        for getter in (
            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
            pynvml.nvmlDeviceGetComputeRunningProcesses,
        ):
            for proc in getter(handle):
                if proc.usedGpuMemory is not None:
                    found[proc.pid] = proc.usedGpuMemory / 2**20
        return found
    except Exception:  # noqa: BLE001 - NVML missing or not permitted: figure left out
        return {}


def rss_mib(pid: int | str = "self") -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB from /proc."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def env_process(conn, scene: str, size: int, steps: int, render_env: dict[str, str]) -> None:
    """One 'env': an EGL context on the scene, two cameras rendered every step."""
    os.environ.update(render_env)
    try:
        from libero_eval.rollout.render_device import check_render_env

        where = check_render_env()
        import mujoco

        model = mujoco.MjModel.from_binary_path(scene)
        data = mujoco.MjData(model)
        before = rss_mib()[0]
        renderer = mujoco.Renderer(model, size, size)
        mujoco.mj_forward(model, data)
        t0 = time.perf_counter()
        for _ in range(steps):
            mujoco.mj_step(model, data)
            for camera in CAMERAS:
                renderer.update_scene(data, camera=camera)
                renderer.render()
        render_ms = 1000 * (time.perf_counter() - t0) / max(steps, 1)
        after, peak = rss_mib()
        conn.send(
            {
                "pid": os.getpid(),
                "where": where,
                "rss_mib": after,
                "peak_rss_mib": peak,
                "renderer_rss_mib": after - before,
                "ms_per_step_2cams": render_ms,
            }
        )
        conn.recv()  # hold the context until the parent has read GPU memory
        renderer.close()
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"})


def measure(scene: str, n: int, size: int, steps: int, render_env: dict[str, str], gpu: int):
    ctx = mp.get_context("spawn")
    base = gpu_used_mib(gpu) if render_env.get("MUJOCO_EGL_DEVICE_ID") is not None else None
    pipes, procs = [], []
    for _ in range(n):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=env_process, args=(child, scene, size, steps, render_env))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    reports = [p.recv() for p in pipes]
    errors = [r["error"] for r in reports if "error" in r]
    used = gpu_used_mib(gpu) if base is not None else None
    per_pid = per_process_gpu_mib(gpu) if base is not None else {}
    for p in pipes:
        if not p.closed:
            p.send("done")
    for proc in procs:
        proc.join(timeout=60)
    if errors:
        return {"envs": n, "error": errors[0]}
    mean = lambda key: sum(r[key] for r in reports) / len(reports)  # noqa: E731
    gpu_pids = [per_pid[r["pid"]] for r in reports if r["pid"] in per_pid]
    return {
        "envs": n,
        "where": reports[0]["where"],
        "rss_mib": mean("rss_mib"),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in reports),
        "renderer_rss_mib": mean("renderer_rss_mib"),
        "ms_per_step_2cams": mean("ms_per_step_2cams"),
        "gpu_mib_total_delta": None if used is None or base is None else used - base,
        "gpu_mib_per_env": None if used is None or base is None else (used - base) / n,
        "gpu_mib_per_env_nvml": sum(gpu_pids) / len(gpu_pids) if gpu_pids else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export-scene", type=Path, help="save a LIBERO scene as .mjb and exit")
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--scene", help="compiled MuJoCo model (.mjb) to render")
    parser.add_argument("--envs", default="1,4", help="comma-separated env counts")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--render-device", default="slot_gpu", help="slot_gpu, cpu or a GPU index")
    parser.add_argument("--gpu", type=int, default=0, help="the slot's GPU for slot_gpu")
    parser.add_argument("--mujoco-gl", default="egl")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--list-devices", action="store_true", help="print the GPUs and EGL devices and exit"
    )
    args = parser.parse_args(argv)
    if args.list_devices:
        from libero_eval.rollout.render_device import query_egl_devices, query_gpus

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        print(f"CUDA_VISIBLE_DEVICES={visible!r}")
        print("nvidia-smi:", query_gpus())
        print("EGL:", query_egl_devices())
        return 0
    if args.export_scene:
        export_scene(args.export_scene, args.suite, args.task, args.size)
        return 0
    if not args.scene:
        parser.error("--scene or --export-scene is required")

    from libero_eval.rollout.render_device import plan_render_env

    choice: str | int = (
        int(args.render_device) if args.render_device.isdigit() else args.render_device
    )
    plan = plan_render_env(
        choice, mujoco_gl=args.mujoco_gl, slot_gpu_ids=[args.gpu], backend="sglang"
    )
    print(f"render device: {plan.description}; env {plan.env}")
    rows = [
        measure(args.scene, int(n), args.size, args.steps, plan.env, args.gpu)
        for n in args.envs.split(",")
    ]
    headers = [
        "envs",
        "host RSS MiB/env",
        "peak RSS MiB",
        "renderer RSS MiB/env",
        "GPU MiB/env (used delta)",
        "GPU MiB/env (NVML)",
        "ms/step (2 cams)",
    ]
    print("| " + " | ".join(headers) + " |\n|" + "---|" * len(headers))
    for row in rows:
        if "error" in row:
            print(f"| {row['envs']} | error: {row['error']} |")
            continue

        def fmt(value: Any) -> str:
            return "" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.2f}"

        print(
            f"| {row['envs']} | {fmt(row['rss_mib'])} | {fmt(row['peak_rss_mib'])} | "
            f"{fmt(row['renderer_rss_mib'])} | {fmt(row['gpu_mib_per_env'])} | "
            f"{fmt(row['gpu_mib_per_env_nvml'])} | {fmt(row['ms_per_step_2cams'])} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"plan": plan.description, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
