"""Throughput, server duty cycle and GPU memory of one workflow run, from what it left behind.

    python benchmarks/workflow_run.py RUN_DIR [RUN_DIR ...] [--json OUT.json]

RUN_DIR holds a run's ``summary/episodes.parquet`` (results/<run>/summary), its serve log
(``<run>/serve/slot0.log`` under logs/) and, optionally, ``gpu.jsonl`` from
tools/gpu/gpu_monitor.py (found as RUN_DIR/../gpu_<run>.jsonl). Figures:

- steps/s and policy observations/s in the steady window: from the first episode's end (every
  env has started by then) to the last episode's start (no env idle yet), each episode's steps
  and calls spread evenly over the time it ran;
- episodes/hour at the protocol's full length: observations/s x 3600 / queries per full episode
  (``--queries-per-episode``; rlinf on libero_spatial 480 / 16 = 30, openpi 220 / 5 = 44);
- duty cycle: SGLang's own stage timings (``[...Stage] finished in X seconds`` lines of the
  serve log) summed over the steady window, over its length;
- GPU: peak memory of the whole GPU, of the server's processes and of the env workers' EGL
  contexts, and the mean utilization in the window.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

STAGE = re.compile(r"^\[(\d\d-\d\d \d\d:\d\d:\d\d)\] \[(\w+)\] finished in ([\d.e+-]+) seconds")
QUERIES = {"rlinf": 30, "openpi": 44, "cosmos": 14}


def _spread(starts, ends, amounts, t0: float, t1: float) -> float:
    """The part of each amount that falls in [t0, t1], amounts spread evenly over their span."""
    total = 0.0
    for start, end, amount in zip(starts, ends, amounts, strict=True):
        span = max(end - start, 1e-9)
        overlap = max(0.0, min(end, t1) - max(start, t0))
        total += amount * overlap / span
    return total


def stage_seconds(log: Path, t0: float, t1: float, year: int) -> tuple[float, int]:
    """Seconds SGLang spent in pipeline stages that finished inside [t0, t1], and their count."""
    busy, count = 0.0, 0
    for line in log.read_text(errors="replace").splitlines():
        match = STAGE.match(line)
        if not match:
            continue
        stamp = datetime.strptime(f"{year}-{match.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp()
        if t0 <= stamp <= t1:
            busy += float(match.group(3))
            count += 1
    return busy, count


def analyze(run_dir: Path, queries_per_episode: int | None) -> dict[str, Any]:
    episodes = pd.read_parquet(run_dir / "summary" / "episodes.parquet")
    ends = episodes["finished_at"].astype(float)
    starts = ends - episodes["wall_time_s"].astype(float)
    t0, t1 = float(ends.min()), float(starts.max())
    if t1 - t0 < 5.0:  # too few episodes for a steady window: the whole run
        t0, t1 = float(starts.min()), float(ends.max())
    window = t1 - t0
    steps = _spread(starts, ends, episodes["steps"], t0, t1)
    calls = _spread(starts, ends, episodes["policy_calls"], t0, t1)
    protocol = str(episodes["protocol"].iloc[0])
    per_episode = queries_per_episode or QUERIES.get(protocol)
    result: dict[str, Any] = {
        "run": run_dir.name,
        "episodes": len(episodes),
        "errors": int(episodes["error"].notna().sum()),
        "protocol": protocol,
        "window_s": round(window, 1),
        "steps_per_s": round(steps / window, 1),
        "obs_per_s": round(calls / window, 2),
        "latency_mean_s": round(float(episodes["policy_latency_mean_s"].mean()), 3),
        "run_s": round(float(ends.max() - starts.min()), 1),
    }
    if per_episode:
        result["episodes_per_hour_full"] = round(calls / window * 3600 / per_episode)
    logs = sorted(run_dir.glob("**/serve/slot0.log"))
    if logs:
        year = datetime.fromtimestamp(t0).year
        busy, count = stage_seconds(logs[0], t0, t1, year)
        result["duty"] = round(busy / window, 3) if count else None
        text = logs[0].read_text(errors="replace")
        admission = re.search(r"Batch admission enabled: [^\n]*", text)
        result["batch_admission"] = admission.group(0) if admission else None
    gpu = run_dir.parent / f"gpu_{run_dir.name}.jsonl"
    if gpu.is_file():
        rows = [json.loads(line) for line in gpu.read_text().splitlines() if line.strip()]
        inside = [r for r in rows if t0 <= r["t"] <= t1] or rows
        result.update(
            gpu_peak_mib=max(r["used_mib"] for r in rows),
            server_peak_mib=max(r["server_mib"] for r in rows),
            renderer_peak_mib=max(r["renderer_mib"] for r in rows),
            renderer_procs=max(r["renderer_procs"] for r in rows),
            gpu_util_mean=round(sum(r["util"] for r in inside) / len(inside), 1),
            gpu_after_mib=rows[-1]["used_mib"],
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--queries-per-episode", type=int)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = [analyze(run, args.queries_per_episode) for run in args.runs]
    keys = [k for k in results[0] if k != "batch_admission"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    for r in results:
        if r.get("batch_admission"):
            print(f"{r['run']}: {r['batch_admission']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
