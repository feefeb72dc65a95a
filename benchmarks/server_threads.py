"""The server's CPU threads (`server.cpu_threads`) swept on one node, with envs beside it.

    python benchmarks/server_threads.py --config config/libero_pi05_openpi_sglang.yaml \\
        --model-path CKPT --attention-backend torch_sdpa --batching-max-size 16 \\
        --threads 4,1,2,8,16,4 --saturate 32 --saturate-s 12 \\
        --beside "python3 tools/gpu/env_load.py --envs 8 --render --seconds 22" \\
        --log-dir LOGS --json OUT.json

One `sglang serve` per thread value is started through the project's launcher, all at once
(each loads in a minute or more; started together they cost one load time), then they are
paused (SIGSTOP to every process of each server) and measured one at a time: resumed, warmed
by a closed loop of `--warm-s` seconds (SGLang captures its CUDA graphs for the batch sizes it
meets), then the closed loop of `benchmarks/sglang_server.py --saturate` alone and beside each
`--beside` load, then paused again. A paused server takes no CPU, so each value is measured
with the node's other cores as the envs leave them. A value given twice is measured twice on
its one server, in the order given (a check for drift during the sweep). The server's own CPU
(its processes' user + system seconds over the closed loop alone) is recorded per value.
Teardown resumes and stops every server and counts the processes left and the GPU memory.
Prints a Markdown table; `--json` keeps every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from libero_eval.policy.http_connection import HttpConnection
from libero_eval.serve.launcher import ManagedServer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_server import (  # noqa: E402
    GpuMemory,
    family_adapter,
    is_alive,
    saturate,
    saturate_beside,
    server_settings,
)


def members(server: ManagedServer) -> list[psutil.Process]:
    """The server's processes: its leader and every descendant."""
    if server.pid is None:
        return []
    try:
        return [psutil.Process(server.pid), *server.track_descendants()]
    except psutil.Error:
        return []


def pause(server: ManagedServer) -> None:
    """Stop every process of the server (SIGSTOP), its group and any descendant outside it."""
    server.send_signal(signal.SIGSTOP)


def resume(server: ManagedServer) -> None:
    """Continue every process of a paused server (SIGCONT)."""
    server.send_signal(signal.SIGCONT)


def cpu_seconds(server: ManagedServer) -> float:
    """User + system CPU seconds used so far by the server's live processes."""
    total = 0.0
    for process in members(server):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def stop_all(servers: list[ManagedServer]) -> dict[str, Any]:
    """Resume and stop every server: exit codes, processes left, teardown seconds."""
    pids = [p.pid for server in servers for p in members(server)]
    started = time.monotonic()
    codes = []
    for server in servers:
        resume(server)
        codes.append(server.stop())
    return {
        "exit_codes": codes,
        "server_processes": len(pids),
        "processes_left": sum(is_alive(pid) for pid in pids),
        "teardown_s": round(time.monotonic() - started, 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    family, adapter = family_adapter(config, args.model_path)
    base = server_settings(config, args)
    values = list(dict.fromkeys(args.threads))  # one server per distinct value
    args.log_dir.mkdir(parents=True, exist_ok=True)
    servers: dict[int, ManagedServer] = {}
    logs = []
    result: dict[str, Any] = {"family": family, "threads": args.threads, "rows": []}
    with GpuMemory() as gpu:
        result["gpu_before_mib"] = gpu.used_mib()
        started = time.monotonic()
        try:
            for threads in values:
                server = ManagedServer(dataclasses.replace(base, cpu_threads=threads))
                log_path = args.log_dir / f"serve_threads{threads}.log"
                logs.append(open(log_path, "w", encoding="utf-8"))  # noqa: SIM115
                server.start(logs[-1], log_path)
                servers[threads] = server
            for server in servers.values():
                server.wait_healthy()
            result["all_ready_s"] = round(time.monotonic() - started, 1)
            result["gpu_all_loaded_mib"] = gpu.used_mib()
            for server in servers.values():
                pause(server)
            for threads in args.threads:
                server = servers[threads]
                resume(server)
                row = one_value(args, family, adapter, server, threads)
                pause(server)
                result["rows"].append(row)
                print("THREADS " + json.dumps(row), flush=True)
            result["gpu_peak_mib"] = gpu.peak_mib
        finally:
            result["teardown"] = stop_all(list(servers.values()))
            for log in logs:
                log.close()
        time.sleep(2.0)
        result["gpu_after_teardown_mib"] = gpu.used_mib()
    return result


def one_value(
    args: argparse.Namespace, family: str, adapter: Any, server: ManagedServer, threads: int
) -> dict[str, Any]:
    """A resumed server's figures: warmed by an untimed closed loop, then the closed loop alone
    (with the server's CPU over it), then beside each load."""
    client = HttpConnection(server.url, timeout_s=60, max_retries=0, wire_format="msgpack")
    max_batch = int(client.metadata().get("capabilities", {}).get("max_batch_size", 1))

    def loop(seconds: float) -> dict[str, Any]:
        return saturate(family, adapter, server.url, args.saturate, seconds, max_batch)

    loop(args.warm_s)
    cpu_before, wall_before = cpu_seconds(server), time.monotonic()
    alone = loop(args.saturate_s)
    cores = (cpu_seconds(server) - cpu_before) / (time.monotonic() - wall_before)
    row: dict[str, Any] = {
        "threads": threads,
        "max_batch_size": max_batch,
        "alone": alone,
        "server_cores_alone": round(cores, 2),
        "beside": [],
    }
    for command in args.beside:
        try:
            beside = saturate_beside(command, lambda: loop(args.saturate_s), idle_s=args.idle_s)
        except (RuntimeError, OSError) as exc:
            beside = {"load": command, "error": str(exc)}
        row["beside"].append(beside)
    return row


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def markdown(result: dict[str, Any]) -> str:
    teardown = result["teardown"]
    lines = [
        f"{result['family']}: {len(set(result['threads']))} servers ready together after "
        f"{result.get('all_ready_s', 'n/a')} s; teardown {teardown['teardown_s']} s, "
        f"{teardown['processes_left']} of {teardown['server_processes']} processes left, "
        f"GPU {result['gpu_after_teardown_mib']} MiB after",
        "",
        "| `cpu_threads` | obs/s alone | server cores alone | obs/s beside a load | "
        "the load's chunks/s, server saturated / idle |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        besides = row["beside"] or [{}]
        for index, beside in enumerate(besides):
            head = (
                [
                    str(row["threads"]),
                    _rate(row["alone"]["obs_per_s"]),
                    f"{row['server_cores_alone']}",
                ]
                if index == 0
                else ["", "", ""]
            )
            if "error" in beside:
                tail = [beside["error"], ""]
            elif beside:
                tail = [
                    _rate(beside["obs_per_s"]),
                    f"{_rate(beside['load_chunks_per_s_saturated'])} / "
                    f"{_rate(beside['load_chunks_per_s_idle'])}",
                ]
            else:
                tail = ["", ""]
            lines.append("| " + " | ".join(head + tail) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a run config with server.sglang")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--command", nargs="+", help="the sglang executable (default: config's)")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--batching-max-size", type=int, default=16)
    parser.add_argument("--pipeline-config", help="server.sglang.pipeline_config as JSON")
    parser.add_argument("--batching-delay-ms", type=float)
    parser.add_argument(
        "--threads",
        type=lambda s: [int(x) for x in s.split(",")],
        required=True,
        help="server.cpu_threads values, measured in this order (e.g. 4,1,2,8,16,4)",
    )
    parser.add_argument("--saturate", type=int, default=32, help="requesters of the closed loop")
    parser.add_argument("--saturate-s", type=float, default=12.0)
    parser.add_argument("--warm-s", type=float, default=6.0, help="untimed closed loop first")
    parser.add_argument("--idle-s", type=float, default=15.0, help="the load's idle window")
    parser.add_argument("--beside", action="append", default=[], metavar="CMD")
    parser.add_argument("--log-dir", type=Path, required=True, help="one serve log per value")
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
