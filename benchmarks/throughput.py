"""Throughput benchmark: env stepping, end-to-end observations/s, server duty cycle, transport
cost and planning cost, measured side by side in one run on one machine.

Sections (pick with --sections, default all):

  a  env steps/s per process: per-step rendering, render on demand, physics only (the floor),
     physics with robosuite's own step loop (states compared), and one render of the two
     cameras alone; env CPU per policy query against its irreducible
     cost (16 physics steps + one render), and the speed-up over per-step rendering.
  b  observations/s end to end: real ShardRunner shards (each in its own process, like a
     rollout job) against the real reference server with a fixed latency model, for a grid of
     envs per shard x shards per server x requests in flight per shard (demand/supply table).
  c  server duty cycle in those runs: the fraction of wall time a request is being served,
     from the server's GET /v1/stats busy_s.
  d  client encode + decode ms per observation: msgpack with raw arrays vs JSON base64 PNG.
  e  planning cost from 1 to 2,000 episodes: plan alone, and `snakemake -n` (DAG build).

    MUJOCO_GL=egl python benchmarks/throughput.py                      # everything
    python benchmarks/throughput.py --sections a,d --chunks 4          # a quick look

The latency model stands in for the GPU: by default 0.5 s per request + 0.05 s per
observation, i.e. 0.55 s for one observation and 0.9 s for a batch of 8 (Cosmos3 at the seed's
30 denoising steps, 320x192, on one H100/H200-class GPU is assumed to be of that order; it is a
model, not a measurement). Everything else is measured. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from throughput_sections.common import CHUNK, REPO_ROOT, machine_summary
from throughput_sections.end_to_end import parse_grid, section_bc
from throughput_sections.env import print_a, section_a
from throughput_sections.planning import section_e
from throughput_sections.transport import section_d

SECTIONS = "abcde"
DEFAULT_GRID_TEXT = "1x1x1,2x1x1,2x1x2,1x2x1,2x2x1,4x1x1"


def parse_task(text: str) -> tuple[str, int]:
    from libero_eval.plan import SUITE_NUM_TASKS

    suite, _, task = text.partition(":")
    if suite not in SUITE_NUM_TASKS or not task.isdigit() or int(task) >= SUITE_NUM_TASKS[suite]:
        raise argparse.ArgumentTypeError(
            f"--task {text!r} must be SUITE:TASK_ID with SUITE one of {sorted(SUITE_NUM_TASKS)} "
            "and a task id of that suite, e.g. libero_spatial:0"
        )
    return suite, int(task)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sections", default=SECTIONS, help="any of 'abcde' (default all)")
    parser.add_argument(
        "--task",
        type=parse_task,
        default=("libero_spatial", 0),
        help="SUITE:TASK_ID for (a), (b), (d) (default libero_spatial:0)",
    )
    parser.add_argument("--init-state", type=int, default=0, help="(a) init state")
    parser.add_argument("--seed", type=int, default=1140, help="random actions and env seed")
    parser.add_argument(
        "--chunks",
        type=int,
        default=6,
        help="(a) timed chunks of 16 steps, on_demand and physics (default 6)",
    )
    parser.add_argument(
        "--every-step-chunks",
        type=int,
        default=2,
        help="(a) timed chunks with per-step rendering (default 2)",
    )
    parser.add_argument(
        "--grid",
        type=parse_grid,
        default=parse_grid(DEFAULT_GRID_TEXT),
        help="(b) cells ENVSxSHARDSxINFLIGHT[m], comma-separated; m: each shard cycles over 10 "
        f"tasks (default {DEFAULT_GRID_TEXT})",
    )
    parser.add_argument(
        "--episode-steps",
        type=int,
        default=160,
        help="(b) policy steps per episode, multiple of 16 (default 160)",
    )
    parser.add_argument("--episodes-per-env", type=int, default=1, help="(b) default 1")
    parser.add_argument("--latency-fixed-s", type=float, default=0.5)
    parser.add_argument("--latency-per-item-s", type=float, default=0.05)
    parser.add_argument("--server-batch", type=int, default=8, help="server max batch size")
    parser.add_argument("--poll-s", type=float, default=0.05, help="(c) /v1/stats poll period")
    parser.add_argument("--cell-timeout-s", type=float, default=300.0)
    parser.add_argument("--repeats", type=int, default=50, help="(d) timing repetitions")
    parser.add_argument(
        "--plan-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 10, 100, 2000],
        help="(e) episode counts",
    )
    parser.add_argument("--slots", type=int, default=8, help="(e) server slots")
    parser.add_argument("--json", type=Path, default=None, help="also write all figures here")
    args = parser.parse_args(argv)
    args.sections = args.sections.replace(",", "")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; use letters of {SECTIONS!r}")
    if args.episode_steps % CHUNK or args.episode_steps < 2 * CHUNK:
        parser.error(f"--episode-steps must be a multiple of {CHUNK} and >= {2 * CHUNK}")
    if min(args.chunks, args.every_step_chunks) < 1:
        parser.error("--chunks and --every-step-chunks must be >= 1")
    if args.every_step_chunks > args.chunks:
        parser.error("--every-step-chunks must not exceed --chunks")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.chdir(REPO_ROOT)
    machine = machine_summary()
    print(
        f"# Throughput benchmark\n\nmachine: {machine['nproc']} CPUs ({machine['cpu']}), "
        f"{machine['mem_gib']} GiB RAM, load average {machine['loadavg']} at start, "
        f"Python {machine['python']}, MUJOCO_GL={machine['mujoco_gl']}\n"
        f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}"
    )
    report: dict[str, Any] = {"machine": machine, "argv": sys.argv[1:]}
    env_result = None
    if "a" in args.sections:
        env_result = section_a(args)
        report["a"] = print_a(env_result)
    if "d" in args.sections:
        report["d"] = section_d(args, env_result)
    if "b" in args.sections or "c" in args.sections:
        report["bc"] = section_bc(args, env_result)
    if "e" in args.sections:
        report["e"] = section_e(args)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average at end: {report['loadavg_end']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
