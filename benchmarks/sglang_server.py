"""Real `sglang serve` through the project's launcher: load, latency against batch size,
GPU memory and teardown.

    python benchmarks/sglang_server.py --config config/libero_spatial_cosmos3_sglang.yaml \\
        --model-path CKPT --batching-max-size 32 --batches 1,8,16,32 --reps 3 \\
        --attention-backend torch_sdpa --json OUT.json --log OUT.serve.log

The server starts as the workflow's `serve` job starts it (`ManagedServer`, the config's
`server` section with the overrides given here). Requests are built by the project's adapter
for the config's `policy.family` from random 256x256 camera frames and sent by its client:
Cosmos3 takes B observations in one request (one prompt); π0.5 takes one observation per
request, so batch B is B requests in flight at once, which SGLang merges up to
`--batching-max-size`. Each batch size is sent once untimed (CUDA graphs, allocator), then
`--reps` times timed. `--saturate N` then keeps N requesters busy for `--saturate-s`
seconds, each sending again as soon as its answer is back (π0.5: one observation each;
Cosmos3: a batch of the server's max batch each): the server's saturated rate, as the
workflow's envs would see it if they took no time to step. `--beside CMD` (repeatable) runs
the closed loop again beside a load: CMD is started, and once it prints a line with
`"load": "ready"` the loop runs; a load that prints `{"t": unix time, "chunks": n}` lines
(`tools/gpu/env_load.py`) gets its rate while the server is saturated and after, while it is
idle, so both sides' slowdown shows. GPU memory comes from NVML
(`pynvml`, where installed): the whole GPU, and the server's own processes. Teardown is
`ManagedServer.stop()`; afterwards the script counts the server's processes still alive and
reads the GPU memory again.
Prints a Markdown table; `--json` keeps every figure.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from libero_eval.policy.families import Observation, make_adapter
from libero_eval.policy.http_connection import HttpConnection
from libero_eval.serve.launcher import ManagedServer
from libero_eval.serve.settings import ServerSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK = "pick up the black bowl between the plate and the ramekin and place it on the plate"


class GpuMemory:
    """Polls NVML every `period_s`: used MiB of GPU `index` and of the given processes."""

    def __init__(self, index: int = 0, period_s: float = 0.5):
        self.period_s = period_s
        self.samples: list[tuple[float, float, float]] = []  # (t, used MiB, util %)
        self.pids: set[int] = set()
        self.process_peak_mib = 0.0
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no NVML (CPU machine): memory figures stay empty
            self._nvml = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def used_mib(self) -> float | None:
        if self._nvml is None:
            return None
        return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20

    def process_mib(self) -> float:
        """GPU memory held by the processes in `pids` (compute and graphics contexts)."""
        if self._nvml is None:
            return 0.0
        total = 0.0
        for query in (
            self._nvml.nvmlDeviceGetComputeRunningProcesses,
            self._nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for proc in query(self._handle):
                if proc.pid in self.pids and proc.usedGpuMemory:
                    total += proc.usedGpuMemory / 2**20
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            used = self.used_mib()
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            self.samples.append((time.monotonic(), used or 0.0, float(util)))
            self.process_peak_mib = max(self.process_peak_mib, self.process_mib())

    def __enter__(self) -> GpuMemory:
        if self._nvml is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @property
    def peak_mib(self) -> float | None:
        return max((s[1] for s in self.samples), default=None)


def observation(rng: np.random.Generator) -> Observation:
    return Observation(
        agentview=rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        wrist=rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        task_language=TASK,
        proprio={
            "robot0_eef_pos": np.array([-0.05, 0.02, 1.1]),
            "robot0_eef_quat": np.array([0.999, 0.02, -0.03, 0.01]),
            "robot0_gripper_qpos": np.array([0.03, -0.03]),
        },
    )


def server_settings(config: dict[str, Any], args: argparse.Namespace) -> ServerSettings:
    server = dict(config["server"])
    sglang = dict(server["sglang"])
    sglang["model_path"] = args.model_path
    sglang["batching_max_size"] = args.batching_max_size
    if args.command:
        sglang["command"] = args.command
    if args.attention_backend:
        sglang["attention_backend"] = args.attention_backend
    if args.pipeline_config is not None:
        sglang["pipeline_config"] = json.loads(args.pipeline_config)
    if args.batching_delay_ms is not None:
        sglang["batching_delay_ms"] = args.batching_delay_ms
    keep = ("host", "port", "health_timeout_s", "teardown_grace_s", "extra_env")
    data = {key: server[key] for key in keep if key in server}
    return ServerSettings.from_dict({"backend": "sglang", "slot": 0, **data, "sglang": sglang})


def time_batch(family: str, adapter: Any, url: str, batch: int, rng: np.random.Generator) -> float:
    """Wall seconds for `batch` observations: one request (Cosmos3), or `batch` requests in
    flight at once (π0.5). Checks that every answer parses to LIBERO actions."""
    if family == "cosmos3":
        client = HttpConnection(url, timeout_s=600, max_retries=0, wire_format="msgpack")
        payload = adapter.build_request([observation(rng) for _ in range(batch)], "bench")
        started = time.perf_counter()
        actions = adapter.parse_response(client.infer(payload), batch)
        seconds = time.perf_counter() - started
        assert actions.shape[0] == batch and np.isfinite(actions).all(), actions.shape
        return seconds
    payloads = [adapter.build_request([observation(rng)], f"bench{i}") for i in range(batch)]
    clients = [
        HttpConnection(url, timeout_s=600, max_retries=0, wire_format="msgpack") for _ in payloads
    ]

    def one(i: int) -> np.ndarray:
        return adapter.parse_response(clients[i].infer(payloads[i]), 1)

    started = time.perf_counter()
    with futures.ThreadPoolExecutor(batch) as pool:
        answers = list(pool.map(one, range(batch)))
    seconds = time.perf_counter() - started
    assert all(a.shape[0] == 1 and np.isfinite(a).all() for a in answers)
    return seconds


def saturate(
    family: str, adapter: Any, url: str, requesters: int, seconds: float, batch: int
) -> dict[str, Any]:
    """Closed loop: `requesters` threads each send, wait for the answer and send again, for
    `seconds`; observations/s over the answers after the first `seconds` / 5 (warm-up)."""
    rng = np.random.default_rng(1)
    per_request = batch if family == "cosmos3" else 1
    payloads = [
        adapter.build_request([observation(rng) for _ in range(per_request)], f"sat{i}")
        for i in range(requesters)
    ]
    answers: list[float] = []
    lock = threading.Lock()
    started = time.perf_counter()
    deadline = started + seconds

    def loop(i: int) -> None:
        client = HttpConnection(url, timeout_s=600, max_retries=0, wire_format="msgpack")
        while time.perf_counter() < deadline:
            actions = adapter.parse_response(client.infer(payloads[i]), per_request)
            assert np.isfinite(actions).all()
            with lock:
                answers.append(time.perf_counter())

    with futures.ThreadPoolExecutor(requesters) as pool:
        list(pool.map(loop, range(requesters)))
    warm = started + seconds / 5
    counted = [t for t in answers if t >= warm]
    span = (max(counted) - warm) if counted else 0.0
    return {
        "requesters": requesters,
        "observations_per_request": per_request,
        "seconds": round(span, 1),
        "requests": len(counted),
        "obs_per_s": round(len(counted) * per_request / span, 2) if span > 0 else None,
    }


def saturate_beside(
    command: str,
    saturated: Callable[[], dict[str, Any]],
    ready_timeout_s: float = 180.0,
    idle_s: float = 30.0,
) -> dict[str, Any]:
    """The closed loop `saturated()` run beside the load `command` (started here, in its own
    process group; after the loop it may run `idle_s` more, then it is stopped): the loop's
    figures, and the load's rate of `chunks` per second while the loop ran and after it (the
    server idle)."""
    load = subprocess.Popen(
        shlex.split(command), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    lines: list[str] = []
    is_ready = threading.Event()

    def read() -> None:
        assert load.stdout is not None
        for line in load.stdout:
            lines.append(line.strip())
            if '"load": "ready"' in line:
                is_ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        waited = 0.0
        while not is_ready.wait(1.0):
            waited += 1.0
            if load.poll() is not None or waited > ready_timeout_s:
                raise RuntimeError(f"load {command!r} never got ready: {lines[-3:]}")
        began = time.time()
        result = saturated()
        ended = time.time()
        with contextlib.suppress(subprocess.TimeoutExpired):
            load.wait(timeout=idle_s)
    finally:
        if load.poll() is None:
            os.killpg(load.pid, signal.SIGTERM)
            load.wait(timeout=30)
        reader.join(timeout=5)
    ticks = [json.loads(line) for line in lines if line.startswith('{"t"')]

    def rate(start: float, end: float) -> float | None:
        inside = [t for t in ticks if start <= t["t"] <= end]
        if len(inside) < 2:
            return None
        return (inside[-1]["chunks"] - inside[0]["chunks"]) / (inside[-1]["t"] - inside[0]["t"])

    result["load"] = command
    result["load_chunks_per_s_saturated"] = rate(began, ended)
    result["load_chunks_per_s_idle"] = rate(ended, float("inf"))
    result["load_last_line"] = lines[-1] if lines else None
    return result


def family_adapter(config: dict[str, Any], model_path: str) -> tuple[str, Any]:
    """The config's policy family and the project's adapter for it, for `model_path`."""
    family = config["policy"].get("family", "cosmos3")
    policy = dict(config["policy"])
    if family == "cosmos3":
        policy = dict(policy["cosmos3"])  # its action_stats_path: package data or a path
    else:  # the served checkpoint decides the request layout (policy.families.pi05.checkpoint)
        policy["pi05"] = dict(policy["pi05"], checkpoint=str(model_path))
    return family, make_adapter(family, policy)


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    family, adapter = family_adapter(config, args.model_path)
    settings = server_settings(config, args)
    result: dict[str, Any] = {"family": family, "batching_max_size": args.batching_max_size}
    rng = np.random.default_rng(0)
    log = open(args.log, "w", encoding="utf-8") if args.log else sys.stdout  # noqa: SIM115
    with GpuMemory() as gpu, ManagedServer(settings) as server:
        result["gpu_before_mib"] = gpu.used_mib()
        server.start(log, args.log)
        result["command"] = server.command
        result["load_s"] = round(server.wait_healthy(), 1)
        gpu.pids = {server.pid, *(p.pid for p in server.track_descendants())}
        result["gpu_after_load_mib"] = gpu.used_mib()
        result["server_process_mib_after_load"] = round(gpu.process_mib())
        client = HttpConnection(server.url, timeout_s=60, max_retries=0, wire_format="msgpack")
        result["metadata"] = client.metadata()
        max_batch = int(result["metadata"].get("capabilities", {}).get("max_batch_size", 1))
        rows = []
        for batch in args.batches:
            if family == "cosmos3" and batch > max_batch:
                rows.append({"batch": batch, "skipped": f"server max_batch_size {max_batch}"})
                continue
            first = time_batch(family, adapter, server.url, batch, rng)
            times = [time_batch(family, adapter, server.url, batch, rng) for _ in range(args.reps)]
            rows.append(
                {
                    "batch": batch,
                    "first_s": round(first, 3),
                    "seconds": [round(t, 3) for t in times],
                    "median_s": round(float(np.median(times)), 3),
                    "obs_per_s": round(batch / float(np.median(times)), 2),
                }
            )
            print("BATCH " + json.dumps(rows[-1]), flush=True)
        result["batches"] = rows
        if args.saturate:
            result["saturated"] = saturate(
                family, adapter, server.url, args.saturate, args.saturate_s, max_batch
            )
            print("SATURATED " + json.dumps(result["saturated"]), flush=True)
        result["beside"] = []
        for command in args.beside:
            try:
                row = saturate_beside(
                    command,
                    lambda: saturate(
                        family, adapter, server.url, args.saturate, args.saturate_s, max_batch
                    ),
                )
            except (RuntimeError, OSError) as exc:
                row = {"load": command, "error": str(exc)}
            result["beside"].append(row)
            print("BESIDE " + json.dumps(result["beside"][-1]), flush=True)
        result["gpu_peak_mib"] = gpu.peak_mib
        result["server_process_peak_mib"] = round(gpu.process_peak_mib)
        members = [server.pid, *(p.pid for p in server.track_descendants())]
        result["server_processes"] = len(members)
        started = time.monotonic()
        result["exit_code"] = server.stop()
        result["teardown_s"] = round(time.monotonic() - started, 2)
        result["processes_left"] = sum(psutil.pid_exists(pid) and is_alive(pid) for pid in members)
        time.sleep(2.0)
        result["gpu_after_teardown_mib"] = gpu.used_mib()
    if log is not sys.stdout:
        log.close()
    return result


def is_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['family']}: /health after {result['load_s']} s; GPU "
        f"{_mib(result['gpu_after_load_mib'])} MiB after load, peak "
        f"{_mib(result['gpu_peak_mib'])}; teardown {result['teardown_s']} s, "
        f"{result['processes_left']} of {result['server_processes']} processes left, GPU "
        f"{_mib(result['gpu_after_teardown_mib'])} MiB after",
        "",
        "| batch | first call s | s per call (median) | observations/s |",
        "|---|---|---|---|",
    ]
    for row in result["batches"]:
        if "skipped" in row:
            lines.append(f"| {row['batch']} | {row['skipped']} | | |")
        else:
            lines.append(
                f"| {row['batch']} | {row['first_s']} | {row['median_s']} | {row['obs_per_s']} |"
            )
    if "saturated" in result:
        sat = result["saturated"]
        lines += [
            "",
            f"saturated: {sat['requesters']} requesters x {sat['observations_per_request']} "
            f"observations, {sat['requests']} requests in {sat['seconds']} s: "
            f"{sat['obs_per_s']} observations/s",
        ]
    for row in result.get("beside", []):
        if "error" in row:
            lines.append(f"beside `{row['load']}`: {row['error']}")
            continue
        lines.append(
            f"beside `{row['load']}`: {row['obs_per_s']} observations/s; the load's chunks/s "
            f"{_rate(row['load_chunks_per_s_saturated'])} with the server saturated, "
            f"{_rate(row['load_chunks_per_s_idle'])} with it idle"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a run config with server.sglang")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--command", nargs="+", help="the sglang executable (default: config's)")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--batching-max-size", type=int, default=32)
    parser.add_argument(
        "--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 16, 32]
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--pipeline-config", help="server.sglang.pipeline_config as JSON (default: the config's)"
    )
    parser.add_argument(
        "--batching-delay-ms",
        type=float,
        help="server.sglang.batching_delay_ms (default: config's)",
    )
    parser.add_argument("--saturate", type=int, default=0, help="requesters of the closed loop")
    parser.add_argument("--saturate-s", type=float, default=20.0)
    parser.add_argument(
        "--beside",
        action="append",
        default=[],
        metavar="CMD",
        help="run the closed loop (--saturate) again beside this load command (repeatable)",
    )
    parser.add_argument("--log", help="the server's log file (default: this stdout)")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
