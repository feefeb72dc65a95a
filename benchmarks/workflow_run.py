"""Throughput, server duty cycle, GPU memory and where the wall time went in one workflow run,
from what it left behind.

    python benchmarks/workflow_run.py RUN_DIR [RUN_DIR ...] [--json OUT.json]

RUN_DIR holds a run's ``summary/`` (results/<run>/summary: ``episodes.parquet``,
``efficiency.csv``), its ``shards/`` (the dispatch logs), its logs (``<run>/serve/slot0.log``,
``<run>/eval_embodiment.log``, from logs/) and, optionally, ``gpu.jsonl`` from
tools/gpu/gpu_monitor.py (found as RUN_DIR/../gpu_<run>.jsonl); tools/gpu/run_h200.sh copies
them so. The windows are the report's (`libero_eval.analysis.timeline`, docs/reporting.md):

- serving: from the run's first policy request to its last answer (the dispatch logs); the
  observations answered ok in it over its length is the report's obs/s. (The window from the
  first episode's end to the last one's start, used before, also held the envs' start.)
  Steps/s spreads each episode's steps evenly over the time it ran;
- mid-run: the middle ``MID`` of the serving window, its answers over its length (the server's
  pace once every env is busy and before the last ones finish);
- the run's timeline (efficiency.csv's columns: launch -> server ready -> first request ->
  last answer -> shard end -> aggregate; its bound and ratio), an env's query mid-run split
  into simulating, rendering and hand-off (`libero_eval.analysis.env_time`), and the launch
  to the report
  (the event log's "workflow end" line, else the report rule's);
- episodes/hour at the protocol's full length: mid-run observations/s x 3600 / queries per
  full episode (``--queries-per-episode``; rlinf on libero_spatial 480 / 16 = 30, openpi
  220 / 5 = 44);
- duty cycle: SGLang's own stage timings (``[...Stage] finished in X seconds`` lines of the
  serve log) summed over the serving window, over its length;
- GPU: peak memory of the whole GPU, of the server's processes and of the env workers' EGL
  contexts, and the mean utilization in the serving window.

``--done`` prints issue 39's table instead, one row per run: launch -> report, the windows,
the bound (the server's start to ready + the run's observations at the closed-loop rate) and
the ratio, the mid-run share of the closed loop, the worst shard's end after its last answer.
The rate is the capacity probe's (the report's), or where ``--rate PREFIX=OBS_PER_S`` or
``--bench PREFIX=BENCH.json`` (``benchmarks/sglang_server.py --saturate``'s ``saturated``) names
the run's prefix (``h200_pi05_``), that one, measured on the same machine.
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
MID = 0.8  # the mid-run window: this middle part of the serving window
# the end of the whole workflow (the Snakefile's onsuccess,
# libero_eval.analysis.timeline.record_end),
# else the report rule's line (libero_eval.report.efficiency write_efficiency_html)
END = re.compile(r"\[workflow\] workflow end: ([\d.]+) s after its launch")
REPORT = re.compile(r"\[report\] slot \d+: launch → report ([\d.]+) s")
# (key, efficiency.csv column, digits): the first slot's timeline (libero_eval.analysis.timeline)
TIMELINE = (
    ("capacity_obs_per_s", "capacity_obs_per_s", 2),
    ("launch_to_server_launch_s", "launch_to_server_launch_s", 1),
    ("start_to_ready_s", "start_to_ready_s", 1),
    ("envs_ready_s", "envs_ready_s", 1),
    ("ready_to_first_request_s", "ready_to_first_request_s", 1),
    ("serving_s", "serving_s", 1),
    ("last_answer_to_shard_end_s", "last_answer_to_shard_end_s", 1),
    ("shard_end_to_aggregate_s", "shard_end_to_aggregate_s", 1),
    ("launch_to_aggregate_s", "wall_s", 1),
    ("observations", "observations", 0),
    ("bound_serving_s", "bound_serving_s", 1),
    ("bound_s", "bound_s", 1),
    ("ratio_aggregate", "wall_over_bound", 2),
    # an env's query mid-run, split (libero_eval.analysis.env_time)
    ("env_query_s", "env_query_s", 3),
    ("env_sim_s", "env_sim_s", 3),
    ("env_render_s", "env_render_s", 3),
    ("env_handoff_s", "env_handoff_s", 3),
    ("env_cpu_s", "env_cpu_s", 3),
    ("env_start_render_s", "env_start_render_s", 3),
)


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


def dispatch_requests(run_dir: Path) -> pd.DataFrame:
    """Every policy request of the run's dispatch logs: sent_at, answered_at, observations, ok."""
    rows = [
        request[:4]
        for path in sorted(run_dir.glob("shards/*.dispatch.json"))
        for request in json.loads(path.read_text())["requests"]
    ]
    return pd.DataFrame(rows, columns=["sent_at", "answered_at", "observations", "ok"])


def report_seconds(run_dir: Path) -> float | None:
    """The launch to the report: the workflow's end line, else the report rule's line."""
    for log in sorted(run_dir.glob("*/eval_embodiment.log")):
        text = log.read_text(errors="replace")
        found = END.findall(text) or REPORT.findall(text)
        if found:
            return float(found[-1])
    return None


def timeline(run_dir: Path) -> dict[str, Any]:
    """The first slot's windows, bound and ratio from the report's efficiency.csv."""
    path = run_dir / "summary" / "efficiency.csv"
    if not path.is_file():
        return {}
    row = pd.read_csv(path).iloc[0]
    found = {
        key: round(float(row[column]), digits)
        for key, column, digits in TIMELINE
        if column in row and pd.notna(row[column])
    }
    report = report_seconds(run_dir)
    if report is not None:
        found["launch_to_report_s"] = round(report, 1)
        if "bound_s" in found:
            found["ratio_report"] = round(report / found["bound_s"], 2)
    return found


def shard_tail(run_dir: Path) -> float | None:
    """The most seconds a shard took from its last answer to its end (its dispatch log's
    timeline, else its last answer and ``ended_at``)."""
    tails = []
    for path in sorted(run_dir.glob("shards/*.dispatch.json")):
        log = json.loads(path.read_text())
        steps = log.get("timeline") or {}
        answers = [r[1] for r in log["requests"]]
        last = steps.get("last_answer") or (max(answers) if answers else None)
        end = steps.get("shard_end") or log.get("ended_at")
        if last is not None and end is not None:
            tails.append(float(end) - float(last))
    return round(max(tails), 1) if tails else None


def analyze(run_dir: Path, queries_per_episode: int | None) -> dict[str, Any]:
    episodes = pd.read_parquet(run_dir / "summary" / "episodes.parquet")
    ends = episodes["finished_at"].astype(float)
    starts = ends - episodes["wall_time_s"].astype(float)
    requests = dispatch_requests(run_dir)
    if requests.empty:
        raise SystemExit(f"{run_dir}: no policy requests in shards/*.dispatch.json")
    t0, t1 = float(requests["sent_at"].min()), float(requests["answered_at"].max())
    window = t1 - t0
    ok = requests[requests["ok"].astype(bool)]
    steps = _spread(starts, ends, episodes["steps"], t0, t1)
    # mid-run: the middle MID of the serving window
    m0, m1 = t0 + window * (1 - MID) / 2, t1 - window * (1 - MID) / 2
    inside = ok[(ok["answered_at"] >= m0) & (ok["answered_at"] <= m1)]
    mid = float(inside["observations"].sum()) / (m1 - m0) if m1 > m0 else float("nan")
    protocol = str(episodes["protocol"].iloc[0])
    per_episode = queries_per_episode or QUERIES.get(protocol)
    result: dict[str, Any] = {
        "run": run_dir.name,
        "episodes": len(episodes),
        "errors": int(episodes["error"].notna().sum()),
        "protocol": protocol,
        "window_s": round(window, 1),
        "steps_per_s": round(steps / window, 1),
        "obs_per_s": round(float(ok["observations"].sum()) / window, 2),
        "mid_obs_per_s": round(mid, 2),
        "latency_mean_s": round(float(episodes["policy_latency_mean_s"].mean()), 3),
    }
    result |= timeline(run_dir)
    result["worst_shard_tail_s"] = shard_tail(run_dir)
    if "capacity_obs_per_s" in result:
        result["mid_of_capacity"] = round(mid / result["capacity_obs_per_s"], 3)
    if per_episode:
        result["episodes_per_hour_full"] = round(mid * 3600 / per_episode)
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
        inside_gpu = [r for r in rows if t0 <= r["t"] <= t1] or rows
        result.update(
            gpu_peak_mib=max(r["used_mib"] for r in rows),
            server_peak_mib=max(r["server_mib"] for r in rows),
            renderer_peak_mib=max(r["renderer_mib"] for r in rows),
            renderer_procs=max(r["renderer_procs"] for r in rows),
            gpu_util_mean=round(sum(r["util"] for r in inside_gpu) / len(inside_gpu), 1),
            gpu_after_mib=rows[-1]["used_mib"],
        )
    return result


def with_rate(result: dict[str, Any], rate: float, source: str) -> dict[str, Any]:
    """The bound and ratios at another closed-loop rate (``source`` says where it is from)."""
    out = dict(result, rate=rate, rate_source=source)
    if "start_to_ready_s" in result and "observations" in result:
        bound = result["start_to_ready_s"] + result["observations"] / rate
        out["bound_s"] = round(bound, 1)
        for key, wall in (
            ("ratio_report", "launch_to_report_s"),
            ("ratio_aggregate", "launch_to_aggregate_s"),
        ):
            if wall in result:
                out[key] = round(result[wall] / bound, 2)
    out["mid_of_capacity"] = round(result["mid_obs_per_s"] / rate, 3)
    return out


def rates(pairs: list[str], benches: list[str]) -> dict[str, tuple[float, str]]:
    """``PREFIX=OBS_PER_S`` and ``PREFIX=BENCH.json`` (its saturated closed loop) -> rate."""
    found: dict[str, tuple[float, str]] = {}
    for pair in pairs:
        prefix, value = pair.split("=", 1)
        found[prefix] = (float(value), "given")
    for pair in benches:
        prefix, path = pair.split("=", 1)
        saturated = json.loads(Path(path).read_text()).get("saturated") or {}
        if saturated.get("obs_per_s"):
            found[prefix] = (float(saturated["obs_per_s"]), f"bench {Path(path).name}")
    return found


DONE = (  # (heading, key, form) of issue 39's table
    ("run", "run", "s"),
    ("episodes", "episodes", "d"),
    ("launch → report", "launch_to_report_s", ".0f"),
    ("server start → ready", "start_to_ready_s", ".0f"),
    ("envs ready (after launch)", "envs_ready_s", ".0f"),
    ("ready → first request", "ready_to_first_request_s", ".1f"),
    ("serving", "serving_s", ".0f"),
    ("last answer → shard end (worst shard)", "worst_shard_tail_s", ".1f"),
    ("bound", "bound_s", ".0f"),
    ("ratio", "ratio_report", ".2f"),
    ("mid-run obs/s (of the closed loop)", "mid", "s"),
    ("closed loop obs/s (source)", "closed", "s"),
    ("an env's query mid-run: simulating / rendering (before ready) / hand-off", "env", "s"),
)


def done_row(result: dict[str, Any]) -> str:
    cells = dict(result)
    rate = result.get("rate", result.get("capacity_obs_per_s"))
    cells["mid"] = f"{result['mid_obs_per_s']:.1f} ({result.get('mid_of_capacity', 0):.0%})"
    cells["closed"] = f"{rate} ({result.get('rate_source', 'capacity probe')})"
    if "env_query_s" in result:
        render = result.get("env_render_s")
        before = result.get("env_start_render_s")
        cells["env"] = (
            f"{result['env_query_s']:.2f} s: {result['env_sim_s']:.2f} / "
            f"{'n/a' if render is None else f'{render:.3f}'} "
            f"({'n/a' if before is None else f'{before:.3f}'}) / {result['env_handoff_s']:.2f}"
        )
    return (
        "| "
        + " | ".join(
            "n/a" if cells.get(key) is None else format(cells[key], form) for _, key, form in DONE
        )
        + " |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--queries-per-episode", type=int)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--done", action="store_true", help="issue 39's table")
    parser.add_argument("--rate", action="append", default=[], help="PREFIX=OBS_PER_S")
    parser.add_argument("--bench", action="append", default=[], help="PREFIX=BENCH.json")
    args = parser.parse_args(argv)
    finished = []
    for run in args.runs:
        if (run / "summary" / "episodes.parquet").is_file():
            finished.append(run)
        else:
            print(
                f"{run}: left out, no summary/episodes.parquet (it did not finish)", file=sys.stderr
            )
    if not finished:
        raise SystemExit("no finished run to show")
    results = [analyze(run, args.queries_per_episode) for run in finished]
    known = rates(args.rate, args.bench)
    for i, result in enumerate(results):
        prefix = max((p for p in known if result["run"].startswith(p)), key=len, default=None)
        if prefix is not None:
            results[i] = with_rate(result, *known[prefix])
    if args.done:
        print("| " + " | ".join(heading for heading, _, _ in DONE) + " |")
        print("|" + "---|" * len(DONE))
        for r in results:
            print(done_row(r))
    else:
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
