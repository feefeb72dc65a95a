"""Record GPU memory and utilization while a run goes, by process kind (NVML via pynvml).

    python tools/gpu/gpu_monitor.py OUT.jsonl [--period-s 1.0] &   # stop it with SIGTERM

Each line: time, the GPU's used MiB and utilization %, and the GPU memory of the SGLang
server's processes (command line mentions sglang) and of every other process holding the
GPU (the env workers' EGL contexts), with their counts. With ``--cpu`` each line also has
where the node's CPU went since the last line, in cores: ``cpu_busy`` (all processes, from
/proc/stat), ``cpu_server``, ``cpu_envs`` (processes named ``libero-env-*``), ``cpu_other``,
the server's three busiest threads (``server_top_threads``: name and cores) and the mean
core clock (``mhz``). ``--summary OUT.jsonl`` prints the peaks and the means while served.
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


class CpuSampler:
    """CPU seconds per process kind between two calls, in cores (CPU seconds / wall seconds)."""

    def __init__(self) -> None:
        self.kinds: dict[int, str] = {}
        self.last: dict[int, float] = {}
        self.last_threads: dict[tuple[int, int], float] = {}
        self.t = time.monotonic()
        self.busy0 = self._busy_seconds()

    @staticmethod
    def _busy_seconds() -> float:
        times = psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    def _kind_of(self, process: psutil.Process) -> str:
        pid = process.pid
        if process.name().startswith("libero-env"):  # named by the worker after it starts
            return "envs"
        if pid not in self.kinds:
            self.kinds[pid] = "server" if _kind(pid) == "server" else "other"
        return self.kinds[pid]

    def sample(self) -> dict:
        now = time.monotonic()
        wall = max(now - self.t, 1e-6)
        self.t = now
        busy = self._busy_seconds()
        out = {
            "cpu_busy": round((busy - self.busy0) / wall, 2),
            "cpu_server": 0.0,
            "cpu_envs": 0.0,
            "cpu_other": 0.0,
        }
        self.busy0 = busy
        seen: dict[int, float] = {}
        threads: list[tuple[float, int, int]] = []
        for process in psutil.process_iter():
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    total = times.user + times.system
                    kind = self._kind_of(process)
                    if kind == "server":
                        for thread in process.threads():
                            key = (process.pid, thread.id)
                            spent = thread.user_time + thread.system_time
                            delta = spent - self.last_threads.get(key, spent)
                            self.last_threads[key] = spent
                            if delta > 0:
                                threads.append((delta / wall, process.pid, thread.id))
            except psutil.Error:
                continue
            seen[process.pid] = total
            delta = total - self.last.get(process.pid, total)
            out[f"cpu_{kind}"] += delta / wall
        self.last = seen
        for key in ("cpu_server", "cpu_envs", "cpu_other"):
            out[key] = round(out[key], 2)
        out["server_top_threads"] = [
            [_thread_name(pid, tid), round(cores, 2)]
            for cores, pid, tid in sorted(threads, reverse=True)[:3]
        ]
        freq = psutil.cpu_freq()
        out["mhz"] = round(freq.current) if freq else None
        return out


def _thread_name(pid: int, tid: int) -> str:
    try:
        comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        comm = "?"
    return f"{pid}/{tid}:{comm}"


def record(out: Path, period_s: float, cpu: bool = False) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    sampler = CpuSampler() if cpu else None
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
            if sampler is not None:
                sample.update(sampler.sample())
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
        **{
            f"mean_{key}_while_served": round(sum(r[key] for r in busy) / len(busy), 2)
            for key in ("cpu_busy", "cpu_server", "cpu_envs", "cpu_other", "mhz")
            if busy and all(r.get(key) is not None for r in busy)
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--period-s", type=float, default=1.0)
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="also record CPU use by kind")
    args = parser.parse_args()
    if args.summary:
        print(json.dumps(summary(args.out)))
    else:
        record(args.out, args.period_s, cpu=args.cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
