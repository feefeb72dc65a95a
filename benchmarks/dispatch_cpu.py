"""Dispatch on the CPU: the workflow end to end against the reference server's latency model.

Real LIBERO envs on this machine's CPU, and the CPU reference server standing in for a
compute-bound GPU: it serves one batch at a time, ``latency_fixed_s + latency_per_item_s x n``
seconds for n observations, at most ``max_batch_size`` per batch. For each cell the benchmark
runs the workflow as a user would (``python -m snakemake --cores N --configfile
config/config.yaml OVERLAY``) in a private working directory (the workflow's files linked in,
as tests/conftest.py ``workflow_dir`` does), then prints the run's own efficiency figures
(``results/<run>/summary/efficiency.csv``, written by the aggregate step; nothing is
recomputed here) next to the capacity of the server's latency model:

    capacity (model) = max_batch / (fixed + per_item x max_batch)   observations/s
    capacity (probe) = what the serve job measured at the server's start (capacity_obs_per_s)

obs/s over the probe's capacity says how close the dispatch comes to a server that is always
busy with full batches. The cells are sized so that the server is the bottleneck (the envs
step a chunk faster than the server answers a full batch) and batching matters (3 envs per
prompt, batches of up to 3). From the shards' dispatch logs it also prints how many requests
went out at each batch size and the server's idle gaps (no request in flight).

With ``--server-start-s S`` the reference server takes S seconds to start
(``server.reference.startup_delay_s``, a model of a GPU server loading its weights): the shard
starts its envs meanwhile, and the benchmark prints from each shard's dispatch log (its
``timeline``) when its envs were ready against the server, how long after the server's ready
its first request left, and how long after its last answer it ended; and the envs and
dispatch it chose (``envs_choice``, ``dispatch_choice``).

Cells (``--cells``, comma-separated):

  cosmos3  policy.family cosmos3: one request carries up to max_batch observations of one
           prompt, the rollout's dispatcher builds the batches.
  pi05     policy.family pi05: one observation per request, the server merges up to
           max_batch concurrent requests into one batch (SGLang's --batching-max-size).

    MUJOCO_GL=egl python benchmarks/dispatch_cpu.py --json results/benchmarks/dispatch_cpu.json
    MUJOCO_GL=egl python benchmarks/dispatch_cpu.py --server-start-s 40
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "profiles")  # as tests/conftest.py
CELLS = ("cosmos3", "pi05")
PI05_TEST_STATS = "libero_eval:stats/pi05_libero_norm_stats.json"  # the reference server's

# What the printed table shows, in order: (header, key of the cell's result).
COLUMNS = (
    ("cell", "cell"),
    ("envs", "envs"),
    ("server model (fixed s, per item s, max batch)", "model"),
    ("capacity model obs/s", "capacity_model_obs_per_s"),
    ("capacity probe obs/s", "capacity_obs_per_s"),
    ("obs/s", "obs_per_s"),
    ("fraction of capacity", "capacity_fraction"),
    ("batch fill", "batch_fill"),
    ("duty", "duty"),
    ("latency p50 s", "latency_p50_s"),
    ("latency p95 s", "latency_p95_s"),
    ("envs waiting", "envs_waiting"),
    ("envs stepping", "envs_stepping"),
    ("a batch's requests leave over, ms", "send_spread_ms"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", default="cosmos3,pi05", help=f"any of {','.join(CELLS)}")
    parser.add_argument("--envs", type=int, default=6, help="env workers, one shard (default 6)")
    parser.add_argument(
        "--task-ids",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 1],
        help="libero_spatial task ids (default 0,1)",
    )
    parser.add_argument("--trials", type=int, default=12, help="trials per task (default 12)")
    parser.add_argument(
        "--max-steps", type=int, default=96, help="rollout.max_steps per episode (default 96)"
    )
    parser.add_argument("--latency-fixed-s", type=float, default=1.0)
    parser.add_argument("--latency-per-item-s", type=float, default=0.25)
    parser.add_argument("--max-batch", type=int, default=3, help="server max batch (default 3)")
    parser.add_argument(
        "--merged-dispatch",
        choices=("auto", "batches", "as_ready"),
        default="auto",
        help="rollout.merged_dispatch for the pi05 cell (default: the schema's, auto)",
    )
    parser.add_argument(
        "--server-start-s",
        type=float,
        default=0.0,
        help="server.reference.startup_delay_s: the server's start, in seconds (default 0)",
    )
    parser.add_argument(
        "--total-num-envs",
        default=None,
        help="rollout.total_num_envs (e.g. auto: --envs is then the most a shard starts)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the private working directories go (default: a new temporary directory, "
        "removed at the end unless --keep)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the working directories")
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="per cell")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    args.cells = [c for c in args.cells.split(",") if c]
    unknown = set(args.cells) - set(CELLS)
    if unknown:
        parser.error(f"--cells: unknown {sorted(unknown)}; use {','.join(CELLS)}")
    return args


def workflow_dir(path: Path) -> Path:
    """A private working directory: the workflow's files linked in, so that results/, logs/
    and .snakemake/ are this benchmark's, never the checkout's."""
    path.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        (path / name).symlink_to(REPO / name)
    return path


def overlay(cell: str, args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    """The cell's config overlay on config/config.yaml."""
    config: dict[str, Any] = {
        "run_id": run_id,
        "plan": {
            "suites": ["libero_spatial"],
            "task_ids": args.task_ids,
            "num_trials_per_task": args.trials,
        },
        "server": {
            "num_slots": 1,
            "reference": {
                "policy": "hold",
                "max_batch_size": args.max_batch,
                "latency_fixed_s": args.latency_fixed_s,
                "latency_per_item_s": args.latency_per_item_s,
            },
        },
        "rollout": {
            "envs_per_shard": args.envs,
            "shards_per_slot": 1,
            "send_privileged_state": False,
            "max_steps": args.max_steps,
        },
    }
    if args.server_start_s:
        config["server"]["reference"]["startup_delay_s"] = args.server_start_s
    if args.total_num_envs is not None:
        config["rollout"]["total_num_envs"] = (
            args.total_num_envs if args.total_num_envs == "auto" else int(args.total_num_envs)
        )
    if cell == "pi05":  # no checkpoint: the reference server's made-up statistics, by name
        config["policy"] = {"family": "pi05", "pi05": {"norm_stats_path": PI05_TEST_STATS}}
        config["rollout"]["merged_dispatch"] = args.merged_dispatch
    return config


def dispatch_summary(shards: Path) -> dict[str, Any]:
    """From the shards' dispatch logs: requests per batch size, and the server's idle gaps
    (no request in flight) inside the span from the first request to the last answer."""
    requests = []
    for path in sorted(shards.glob("*.dispatch.json")):
        requests += json.loads(path.read_text())["requests"]
    sizes = Counter(int(r[2]) for r in requests)
    spans = sorted((float(r[0]), float(r[1])) for r in requests)
    gaps, end = [], spans[0][1] if spans else 0.0
    for sent, answered in spans[1:]:
        if sent > end:
            gaps.append(sent - end)
        end = max(end, answered)
    start = spans[0][0] if spans else 0.0
    first_full = next((r[0] - start for r in sorted(requests) if r[2] == max(sizes)), None)
    return {
        "requests_by_size": dict(sorted(sizes.items(), reverse=True)),
        "idle_gaps": len(gaps),
        "idle_s": round(sum(gaps), 2),
        "idle_longest_s": round(max(gaps), 2) if gaps else 0.0,
        "first_full_batch_after_s": round(first_full, 2) if first_full is not None else None,
    }


def timelines(shards: Path, service_file: Path) -> list[dict[str, Any]]:
    """Per shard, from its dispatch log's timeline (and the service file's, where the serve
    side writes one): the gaps of issue 39's targets, in seconds, and its choices."""
    service = json.loads(service_file.read_text()) if service_file.exists() else {}
    launch = (service.get("timeline") or {}).get("launch")
    # the serve job's own "ready" (its timeline's, else ready_at, to the second)
    ready = (service.get("timeline") or {}).get("ready")
    if ready is None and service.get("ready_at"):
        ready = datetime.fromisoformat(service["ready_at"]).timestamp()
    rows = []
    for path in sorted(shards.glob("*.dispatch.json")):
        log = json.loads(path.read_text())
        t = log.get("timeline") or {}

        def gap(later: str, earlier: str, t: dict = t) -> float | None:
            if t.get(later) is None or t.get(earlier) is None:
                return None
            return round(t[later] - t[earlier], 2)

        rows.append(
            {
                "shard": log["shard"],
                "envs_ready_after_job_start_s": gap("envs_ready", "job_start"),
                "server_ready_after_job_start_s": gap("service_ready", "job_start"),
                "envs_ready_before_server_s": gap("service_ready", "envs_ready"),
                "first_request_after_ready_s": gap("first_request", "service_ready"),
                "first_request_after_serve_ready_s": (
                    round(t["first_request"] - ready, 2)
                    if ready is not None and t.get("first_request") is not None
                    else None
                ),
                "serving_s": gap("last_answer", "first_request"),
                "end_after_last_answer_s": gap("shard_end", "last_answer"),
                "job_start_after_launch_s": (
                    round(t["job_start"] - launch, 2) if launch and t.get("job_start") else None
                ),
                "envs": (log.get("envs_choice") or {}).get("envs"),
                "envs_started": log.get("envs_started"),
                "envs_reason": (log.get("envs_choice") or {}).get("reason"),
                "dispatch": (log.get("dispatch_choice") or {}).get("merged_dispatch"),
                "dispatch_reason": (log.get("dispatch_choice") or {}).get("reason"),
            }
        )
    return rows


def run_cell(cell: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    run_id = f"dispatch_cpu_{cell}"
    work = workflow_dir(root / cell)
    configfile = work / "overlay.yaml"
    configfile.write_text(yaml.safe_dump(overlay(cell, args, run_id), sort_keys=False))
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        str(args.envs),  # the rollout job's threads are its envs, lowered to --cores
        "--configfile",
        "config/config.yaml",
        "overlay.yaml",
    ]
    print(f"\n{cell}: {' '.join(command[1:])} (in {work})", flush=True)
    started = time.perf_counter()
    proc = subprocess.run(
        command, cwd=work, capture_output=True, text=True, timeout=args.timeout_s, check=False
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{cell}: snakemake failed ({proc.returncode}); see {work}/logs")
    results = work / "results" / run_id
    with open(results / "summary" / "efficiency.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    if len(rows) != 1:
        raise SystemExit(f"{cell}: expected one slot in efficiency.csv, got {len(rows)}")
    row = rows[0]
    fixed, per_item, batch = args.latency_fixed_s, args.latency_per_item_s, args.max_batch
    result: dict[str, Any] = {
        "cell": cell,
        "run_id": run_id,
        "wall_s": round(wall, 1),
        "model": f"{fixed:g}, {per_item:g}, {batch}",
        "capacity_model_obs_per_s": batch / (fixed + per_item * batch),
        "tasks": len(args.task_ids),
        "trials_per_task": args.trials,
        "max_steps": args.max_steps,
        **{k: row[k] for k in row},
        **dispatch_summary(results / "shards"),
    }
    result = {key: number(value) for key, value in result.items()}
    result["timelines"] = timelines(results / "shards", results / "servers" / "slot0.json")
    return result


def number(value: Any) -> Any:
    """A CSV field as int or float where it is one, else as it is."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def cell_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


TIMELINE_COLUMNS = (
    ("cell", "cell"),
    ("shard", "shard"),
    ("envs ready after job start s", "envs_ready_after_job_start_s"),
    ("server ready after job start s", "server_ready_after_job_start_s"),
    ("envs ready before the server s", "envs_ready_before_server_s"),
    ("first request after the shard saw ready s", "first_request_after_ready_s"),
    ("first request after the serve job's ready s", "first_request_after_serve_ready_s"),
    ("serving s", "serving_s"),
    ("shard end after last answer s", "end_after_last_answer_s"),
    ("envs kept / started", "envs_kept"),
    ("dispatch", "dispatch"),
)


def print_timelines(results: list[dict[str, Any]]) -> None:
    """Each shard's start and end (its dispatch log's timeline), and what it chose and why."""
    rows = [
        {**t, "cell": r["cell"], "envs_kept": f"{t['envs']} / {t['envs_started']}"}
        for r in results
        for t in r["timelines"]
    ]
    if not rows:
        return
    print("\n| " + " | ".join(h for h, _ in TIMELINE_COLUMNS) + " |")
    print("|" + "---|" * len(TIMELINE_COLUMNS))
    for row in rows:
        print("| " + " | ".join(cell_text(row.get(k)) for _, k in TIMELINE_COLUMNS) + " |")
    for row in rows:
        print(f"\n{row['cell']} {row['shard']}: envs: {row['envs_reason']}")
        print(f"{row['cell']} {row['shard']}: dispatch: {row['dispatch_reason']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    load = [round(x, 2) for x in os.getloadavg()]
    print(
        f"# Dispatch on the CPU (reference latency model)\n\n{os.cpu_count()} CPUs, load "
        f"average {load} at start, Python {sys.version.split()[0]}, "
        f"MUJOCO_GL={os.environ['MUJOCO_GL']}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
        f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}\n"
        f"plan: libero_spatial tasks {args.task_ids} x {args.trials} trials, "
        f"{args.max_steps} steps per episode, {args.envs} envs in one shard, one server"
        f"{f' taking {args.server_start_s:g} s to start' if args.server_start_s else ''}"
    )
    root = args.workdir or Path(tempfile.mkdtemp(prefix="dispatch_cpu_"))
    results = []
    try:
        for cell in args.cells:
            results.append(run_cell(cell, args, root))
            r = results[-1]
            print(
                f"{cell}: {r['wall_s']} s wall, {r['episodes_run']} episodes, "
                f"{r['requests']} requests / {r['observations']} observations over "
                f"{r['span_s']:.1f} s, requests by batch size {r['requests_by_size']}, "
                f"server idle {r['idle_s']} s in {r['idle_gaps']} gaps "
                f"(longest {r['idle_longest_s']} s), first full batch "
                f"{r['first_full_batch_after_s']} s after the first request",
                flush=True,
            )
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        elif results:
            print(f"working directories kept under {root}")
    print()
    print("| " + " | ".join(h for h, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for r in results:
        print("| " + " | ".join(cell_text(r[k]) for _, k in COLUMNS) + " |")
    for r in results:
        if r.get("warning"):
            print(f"\n{r['cell']}: {r['warning']}")
    print_timelines(results)
    end_load = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average at end: {end_load}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"argv": sys.argv[1:], "loadavg": [load, end_load], "cells": results}
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
