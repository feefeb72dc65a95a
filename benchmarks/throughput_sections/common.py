"""Helpers every throughput section shares: paths, the chunk length, CPU/wall timing, Markdown
tables, the workflow config with the schema's defaults, and the machine summary."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libero_eval import package_data

REPO_ROOT = Path(__file__).resolve().parents[2]
STATS = package_data.path("stats/libero_native_frame_wise_relative_rot6d.json")
CHUNK = 16


def cpu_seconds() -> float:
    """CPU time of this process, all threads included (llvmpipe renders on its own threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Cost:
    """Wall and CPU seconds of `count` repetitions of something."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    count: int = 0

    @property
    def wall_ms(self) -> float:
        return 1000 * self.wall_s / max(self.count, 1)

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / max(self.count, 1)


@contextlib.contextmanager
def measure(cost: Cost, count: int = 1) -> Iterator[None]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    cost.wall_s += time.perf_counter() - wall
    cost.cpu_s += cpu_seconds() - cpu
    cost.count += count


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def default_config(**overrides: Any) -> dict[str, Any]:
    """The workflow config with the schema's defaults filled in (as common.smk does)."""
    from libero_eval.config import validate_config

    config: dict[str, Any] = {"run_id": "bench_throughput", **overrides}
    validate_config(config)
    config["policy"]["cosmos3"]["action_stats_path"] = str(STATS)
    return config


def machine_summary() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "mem_gib": mem_gib,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "mujoco_gl": os.environ.get("MUJOCO_GL", "egl"),
    }


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * min(times)
