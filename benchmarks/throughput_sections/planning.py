"""(e) planning cost from 1 to 2,000 episodes: the plan alone, and `snakemake -n` (DAG build)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from throughput_sections.common import REPO_ROOT, best_ms, default_config, table


def plan_for(size: int) -> dict[str, Any]:
    """A plan section with exactly `size` episodes (up to 2,000: 4 suites x 10 tasks x 50)."""
    suites = ["libero_spatial", "libero_object", "libero_goal", "libero_10"]
    if size <= 10:
        return {"suites": suites[:1], "task_ids": list(range(size)), "num_trials_per_task": 1}
    if size <= 500 and size % 10 == 0:
        return {"suites": suites[:1], "task_ids": "all", "num_trials_per_task": size // 10}
    if size <= 2000 and size % 40 == 0:
        return {"suites": suites, "task_ids": "all", "num_trials_per_task": size // 40}
    raise SystemExit(f"--plan-sizes: {size} is not 1..10, a multiple of 10 up to 500, or of 40")


def section_e(args: argparse.Namespace) -> dict[str, Any]:
    from libero_eval.config import check_config
    from libero_eval.plan import plan_table

    rows, records = [], []
    workdir = Path(tempfile.mkdtemp(prefix="libero_bench_dag_"))
    try:
        for size in args.plan_sizes:
            overrides = {
                "run_id": f"bench_throughput_dag{size}",
                "plan": plan_for(size),
                "server": {"num_slots": args.slots, "reference": {"policy": "hold"}},
                "rollout": {"send_privileged_state": False},
            }
            config = default_config(**json.loads(json.dumps(overrides)))

            def plan(config=config):
                shards = check_config(config).shards
                return plan_table(shards), shards

            frame, shards = plan()
            if len(frame) != size:
                raise SystemExit(f"(e) planned {len(frame)} episodes, expected {size}")
            plan_ms = best_ms(plan, 5)
            configfile = workdir / f"config{size}.json"
            configfile.write_text(json.dumps(overrides))
            command = [
                str(Path(sys.executable).with_name("snakemake")),
                "-n",
                "--nolock",
                "--cores",
                "2",
                "--configfile",
                str(configfile),
                "--quiet",
                "rules",
            ]
            started = time.perf_counter()
            done = subprocess.run(
                command, cwd=REPO_ROOT, capture_output=True, text=True, check=False
            )
            dag_s = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"(e) {' '.join(command)} failed:\n{done.stderr[-2000:]}")
            totals = re.findall(r"^total\s+(\d+)", done.stdout + done.stderr, re.MULTILINE)
            jobs = int(totals[-1]) if totals else "?"
            rows.append([size, len(shards), args.slots, jobs, plan_ms, dag_s])
            records.append(
                {
                    "episodes": size,
                    "shards": len(shards),
                    "jobs": jobs,
                    "plan_ms": plan_ms,
                    "snakemake_n_s": dag_s,
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n### (e) Planning and DAG build ({args.slots} server slots, 1 shard per slot)\n")
    print(
        table(
            [
                "episodes",
                "shards",
                "slots",
                "DAG jobs",
                "plan ms (check + shards + table)",
                "snakemake -n s (incl. startup)",
            ],
            rows,
        )
    )
    return {"rows": records}
