"""Record GPU memory and utilization while a run goes, by process kind (NVML via pynvml).

    python tools/gpu/gpu_monitor.py OUT.jsonl [--period-s 1.0] &   # stop it with SIGTERM

Each line: time, the GPU's used MiB and utilization %, and the GPU memory of the SGLang
server's processes (command line mentions sglang) and of every other process holding the
GPU (the env workers' EGL contexts), with their counts. ``--summary OUT.jsonl`` prints the
peaks and the mean utilization.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import psutil


def is_server_command(line: list[str]) -> bool:
    """A command line of the SGLang server: `sglang serve ...` (any path to the entry script),
    `python -m sglang...`, or a worker that SGLang renamed ("sgl_diffusion::scheduler").
    A command that only names a file with "sglang" in it (Snakemake's
    `--configfile config/..._sglang.yaml`) is not one."""
    if not line:
        return False
    if line[0].startswith(("sglang", "sgl_diffusion::")):
        return True
    for i, arg in enumerate(line[:-1]):
        if arg.rsplit("/", 1)[-1] == "sglang" and line[i + 1] == "serve":
            return True
        if arg == "-m" and line[i + 1].startswith("sglang"):
            return True
    return False


def _kind(pid: int) -> str:
    """ "server" for the SGLang server and its workers (a process whose command line, or an
    ancestor's, is the server's), "renderer" for any other process holding the GPU."""
    try:
        process = psutil.Process(pid)
        lines = [process.cmdline(), *(p.cmdline() for p in process.parents())]
    except psutil.Error:
        return "other"
    return "server" if any(is_server_command(line) for line in lines) else "renderer"


def record(out: Path, period_s: float) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with out.open("a", encoding="utf-8") as sink:
        while not stop:
            sample = {
                "t": round(time.time(), 2),
                "used_mib": round(pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20),
                "util": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                "server_mib": 0,
                "renderer_mib": 0,
                "server_procs": 0,
                "renderer_procs": 0,
            }
            seen = set()
            for query in (
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                pynvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                for proc in query(handle):
                    if proc.pid in seen:
                        continue
                    seen.add(proc.pid)
                    kind = _kind(proc.pid)
                    if kind == "other":
                        continue
                    sample[f"{kind}_mib"] += round((proc.usedGpuMemory or 0) / 2**20)
                    sample[f"{kind}_procs"] += 1
            sink.write(json.dumps(sample) + "\n")
            sink.flush()
            time.sleep(period_s)


def summary(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    busy = [r for r in rows if r["server_procs"]]
    return {
        "samples": len(rows),
        "peak_used_mib": max((r["used_mib"] for r in rows), default=None),
        "peak_server_mib": max((r["server_mib"] for r in rows), default=None),
        "peak_renderer_mib": max((r["renderer_mib"] for r in rows), default=None),
        "peak_renderer_procs": max((r["renderer_procs"] for r in rows), default=None),
        "mean_util_while_served": round(sum(r["util"] for r in busy) / len(busy), 1)
        if busy
        else None,
        "last_used_mib": rows[-1]["used_mib"] if rows else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--period-s", type=float, default=1.0)
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    if args.summary:
        print(json.dumps(summary(args.out)))
    else:
        record(args.out, args.period_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
