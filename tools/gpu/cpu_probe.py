"""Does load on other cores slow one thread on its own core? A fixed single-thread Python loop
(the kind of work a server's launch thread does) timed on CPU 0, alone and beside N processes on
the other CPUs that either spin (arithmetic, no memory traffic: what they take is the cores'
shared clock, if anything) or stream memory (64 MiB copies: caches and memory bandwidth).

    python3 tools/gpu/cpu_probe.py --loads spin:8 spin:15 stream:8 --seconds 4

Prints one JSON line per load: the loop's rate (loops/s) beside it, its rate alone just before
(a virtual machine's own speed drifts: on one H200 node the loop alone ran 36% faster at the
end of a probe than at its start), their ratio, and the CPU clock Linux reports
(`/proc/cpuinfo`, which a virtual machine may not update).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np


def spin(cpu: int, stop: mp.Event) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def stream(cpu: int, stop: mp.Event) -> None:
    os.sched_setaffinity(0, {cpu})
    a = np.ones(8 * 2**20)  # 64 MiB
    b = np.empty_like(a)
    while not stop.is_set():
        np.copyto(b, a)


def loop_rate(seconds: float) -> float:
    """Runs of a fixed pure-Python loop per second on this thread."""
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        total = 0
        for i in range(10_000):
            total += i * i
        done += 1
    return done / elapsed


def clock_mhz() -> float | None:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    values = [float(x.split(":")[1]) for x in lines if x.startswith("cpu MHz")]
    return round(sum(values) / len(values), 1) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", nargs="*", default=["spin:8", "spin:15", "stream:8"])
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    probe_cpu, others = cpus[0], cpus[1:]
    os.sched_setaffinity(0, {probe_cpu})
    for load in args.loads:  # each load against the loop alone just before it
        alone = loop_rate(args.seconds)
        kind, count = load.split(":")
        target = {"spin": spin, "stream": stream}[kind]
        stop = mp.Event()
        workers = [
            mp.Process(target=target, args=(others[i % len(others)], stop), daemon=True)
            for i in range(int(count))
        ]
        for worker in workers:
            worker.start()
        time.sleep(1.0)
        rate = loop_rate(args.seconds)
        mhz = clock_mhz()
        stop.set()
        for worker in workers:
            worker.join(timeout=10)
        row = {
            "load": load,
            "loops_per_s_alone": round(alone, 1),
            "loops_per_s": round(rate, 1),
            "ratio": round(rate / alone, 3),
            "cpu_mhz": mhz,
            "probe_cpu": probe_cpu,
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
