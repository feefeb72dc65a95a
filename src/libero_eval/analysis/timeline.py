"""Where a run's wall time went, per server slot: from the workflow's launch to its report,
against the bound the server sets.

The instants come from what each step wrote down (docs/reporting.md, "Where the wall time
went"): the workflow's launch (the Snakefile's ``onstart``: a "workflow launch" line in the event
log, with the epoch at which the ``snakemake`` process started); the slot's service file
(``"timeline"``: the server's ``launch``, ``healthy``, ``probe_done``, ``ready``, and its
``"startup_parts"``, `libero_eval.serve.job`); each shard's dispatch log (``"timeline"``:
``job_start``, ``envs_ready``, ``first_request``, ``last_answer``, ``shard_end``,
`libero_eval.rollout.dispatch_log`; from an older runner, the first request and the last answer
come from its requests and the shard's end from ``ended_at``); and the aggregate step's own
clock. A slot's shards are merged: its envs are ready when the last shard's are, it first
asks when the first shard does, and it ends with its last shard.

The bound is what the server alone would take: its start to "ready" plus the slot's
observations at its closed-loop rate (the capacity probe's ``obs_per_s``,
`libero_eval.policy.capacity`). The wall time is the launch to the aggregate step (the report
page adds the report, `libero_eval.report.efficiency`); their ratio says how far the run is
from its server's pace. Every figure is NaN where an instant is unknown, never guessed.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from libero_eval.analysis.display import markdown_table, number
from libero_eval.analysis.efficiency_inputs import ServiceTimeline
from libero_eval.eventlog import last_invocation_start, log_event, log_launch
from libero_eval.serve.startup import describe_parts

# the Snakefile's onstart line (workflow/rules/common.smk, workflow_launch)

#: instants, as seconds after the origin (the workflow's launch, else the server's)
INSTANTS = (
    "server_launch_s",
    "server_ready_s",
    "envs_ready_s",
    "first_request_s",
    "last_answer_s",
    "shard_end_s",
    "aggregate_s",
)
#: (column, from, to, what the row says): the windows between instants
GAPS = (
    ("launch_to_server_launch_s", None, "server_launch_s", "launch → server launch"),
    ("start_to_ready_s", "server_launch_s", "server_ready_s", "server start → ready"),
    ("ready_to_first_request_s", "server_ready_s", "first_request_s", "ready → first request"),
    ("serving_s", "first_request_s", "last_answer_s", "first request → last answer"),
    ("last_answer_to_shard_end_s", "last_answer_s", "shard_end_s", "last answer → shard end"),
    ("shard_end_to_aggregate_s", "shard_end_s", "aggregate_s", "shard end → aggregate"),
)
COLUMNS = (
    "launch_at",
    "timeline_origin",
    *INSTANTS,
    *(gap[0] for gap in GAPS),
    "wall_s",
    "bound_serving_s",
    "bound_s",
    "wall_over_bound",
    "startup_parts",
    "envs_choice",  # the rollout's choice of env count and dispatch, with why (dispatch log)
    "dispatch_choice",
)
# the dispatch log's choices: its key -> the value's key in it
CHOICES = {"envs_choice": "envs", "dispatch_choice": "merged_dispatch"}


# A Snakemake process that had waited longer than this beyond its own CPU time when the workflow
# was parsed ran something else first (see `launch_epoch`)
EXEC_GAP_S = 10.0


def launch_epoch(
    created: float, parsed_at: float, cpu_s: float, gap_s: float = EXEC_GAP_S
) -> float:
    """When Snakemake started: its process's start (`created`), unless by `parsed_at` (wall
    clock, as the workflow was parsed) the process had waited more than `gap_s` beyond the
    `cpu_s` it had used. A shell running `pip install ... && snakemake` (the README's demo
    command) execs Snakemake in its own process, created before pip ran (bash 5.2 runs the
    last command of a `bash -c` and-list without a fork: tests/test_timeline.py runs it);
    until the workflow is parsed Snakemake only computes (its imports), so it started at
    `parsed_at - cpu_s`."""
    if parsed_at - created - cpu_s > gap_s:
        return parsed_at - cpu_s
    return created


def record_launch(
    event_log: Path | str | None,
    rollout_jobs: int = 0,
    parsed: tuple[float, float] | None = None,
) -> None:
    """The "workflow launch" line (the Snakefile's ``onstart``, once Snakemake has built its
    DAG and is about to start its jobs), with the epoch at which this process (``snakemake``)
    started: the run's launch, as a user waits for it. `parsed`: the wall clock and the
    process's CPU seconds as the workflow was parsed (`launch_epoch`)."""
    created = psutil.Process().create_time()
    started = created if parsed is None else launch_epoch(created, *parsed)
    log_launch(event_log, started, os.getpid(), rollout_jobs)


def record_end(event_log: Path | str | None) -> None:
    """The "workflow end" line (the Snakefile's ``onsuccess``, every job done, the report's
    too): the seconds since the last "workflow launch" line's epoch."""
    launch = launch_time(event_log)
    since = f"{time.time() - launch:.1f} s after its launch" if launch else "its launch unknown"
    log_event(event_log, "workflow", f"workflow end: {since}")


def launch_time(event_log: Path | str | None) -> float | None:
    """The epoch of the last "workflow launch" line of the run's event log (None without)."""
    return last_invocation_start(event_log)


def _first(values: Sequence[float | None], pick: Any) -> float:
    known = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return pick(known) if known else math.nan


def shard_instants(log: Mapping[str, Any]) -> dict[str, float | None]:
    """A dispatch log's instants (epoch seconds): its ``"timeline"`` where it has one, else
    what an older runner's log gives (its requests, ``ended_at``)."""
    timeline = log.get("timeline") or {}
    requests = log.get("requests") or []
    return {
        "envs_ready": timeline.get("envs_ready"),
        "first_request": timeline.get("first_request")
        or (min(r[0] for r in requests) if requests else None),
        "last_answer": timeline.get("last_answer")
        or (max(r[1] for r in requests) if requests else None),
        "shard_end": timeline.get("shard_end") or log.get("ended_at"),
    }


def slot_timeline(
    logs: Sequence[Mapping[str, Any]],
    service: ServiceTimeline | None,
    launch: float | None,
    aggregate: float,
    observations: int,
    obs_per_s: float,
) -> dict[str, Any]:
    """One slot's timeline (:data:`COLUMNS`): its shards' dispatch logs merged, its server's
    service timeline, the workflow's ``launch`` and the aggregate step's time (epochs), and
    the bound from its ``observations`` and its server's closed-loop ``obs_per_s``."""
    shards = [shard_instants(log) for log in logs]
    epochs = {
        "server_launch_s": service.launch if service else None,
        "server_ready_s": service.ready if service else None,
        "envs_ready_s": _first([s["envs_ready"] for s in shards], max),
        "first_request_s": _first([s["first_request"] for s in shards], min),
        "last_answer_s": _first([s["last_answer"] for s in shards], max),
        "shard_end_s": _first([s["shard_end"] for s in shards], max),
        "aggregate_s": aggregate,
    }
    origin_name, origin = "workflow launch", launch
    if origin is None and service is not None and service.launch is not None:
        origin_name, origin = "server launch", service.launch
    row: dict[str, Any] = {
        "launch_at": origin if origin is not None else math.nan,
        "timeline_origin": origin_name if origin is not None else "",
    }
    for name in INSTANTS:
        at = epochs[name]
        row[name] = float(at) - origin if at is not None and origin is not None else math.nan
    for column, start, end, _ in GAPS:
        # the first window starts at the workflow's launch: unknown without it
        begin = row[start] if start else (0.0 if launch is not None else math.nan)
        row[column] = row[end] - begin
    # from the origin: the workflow's launch, else (a training run's checkpoint, whose server
    # waited for a GPU while others ran) its server's launch, the checkpoint's own time
    row["wall_s"] = row["aggregate_s"]
    serving_bound = observations / obs_per_s if obs_per_s > 0 else math.nan
    row["bound_serving_s"] = serving_bound
    row["bound_s"] = row["start_to_ready_s"] + serving_bound
    row["wall_over_bound"] = row["wall_s"] / row["bound_s"] if row["bound_s"] > 0 else math.nan
    parts = service.startup_parts if service else {}
    row["startup_parts"] = " ".join(f"{k}={v:g}" for k, v in parts.items())
    for column, key in CHOICES.items():
        row[column] = choices(logs, column, key)
    return row


def choices(logs: Sequence[Mapping[str, Any]], column: str, key: str) -> str:
    """A slot's shards' choice (``"32 (setting auto): <reason>"``), once per distinct one."""
    seen: list[str] = []
    for log in logs:
        choice = log.get(column)
        if isinstance(choice, Mapping) and key in choice:
            value = "none" if choice[key] is None else choice[key]
            text = f"{value} (setting {choice.get('setting')}): {choice.get('reason', '')}"
            if text not in seen:
                seen.append(text)
    return "; ".join(seen)


def report_window(row: Mapping[str, Any], now: float) -> dict[str, float]:
    """The run's launch to the report (``now``), its bound and their ratio (NaN where the
    workflow's launch is unknown)."""
    launched = row.get("timeline_origin") == "workflow launch"
    wall = now - float(row["launch_at"]) if launched else math.nan
    bound = float(row.get("bound_s", math.nan))
    return {"report_s": wall, "bound_s": bound, "ratio": wall / bound if bound > 0 else math.nan}


# --------------------------------------------------------------------------- text


def _envs_note(row: Mapping[str, Any]) -> str:
    """``envs ready 41.0 s after launch, 55.0 s before the server was ready``."""
    envs, ready = row["envs_ready_s"], row["server_ready_s"]
    if math.isnan(envs):
        return ""
    note = f"envs ready {envs:.1f} s after the {row['timeline_origin']}"
    if not math.isnan(ready):
        when = "before" if envs <= ready else "after"
        note += f", {abs(ready - envs):.1f} s {when} the server was ready"
    return note


def _origin_short(row: Mapping[str, Any]) -> str:
    """``launch`` (the workflow's) or ``server launch``: where a slot's wall time counts from."""
    return "launch" if row["timeline_origin"] == "workflow launch" else row["timeline_origin"]


def timeline_line(row: Mapping[str, Any]) -> str:
    """The event log's line for a slot."""
    gaps = ", ".join(f"{label} {number(row[column])} s" for column, _, _, label in GAPS)
    line = f"slot {row['slot']} timeline: {gaps}"
    envs = _envs_note(row)
    line += f"; {envs}" if envs else ""
    if not math.isnan(row["wall_s"]):
        line += (
            f"; {_origin_short(row)} → aggregate {row['wall_s']:.1f} s against a bound of "
            f"{number(row['bound_s'])} s ({number(row['start_to_ready_s'])} s to ready + "
            f"{row['observations']} observations at {number(row['capacity_obs_per_s'], '.2f')} "
            f"obs/s): {number(row['wall_over_bound'], '.2f')}x"
        )
    return line


def timeline_markdown(row: Mapping[str, Any]) -> str:
    """A slot's "Where the wall time went" table: each window, and the bound's two parts
    against the windows they bound."""
    if not row["timeline_origin"]:
        return "\nWhere the wall time went: unknown (no launch or server timeline).\n"
    rate = number(row["capacity_obs_per_s"], ".2f")
    bound_parts = {
        "start_to_ready_s": f"{number(row['start_to_ready_s'])} (the server's own start)",
        "serving_s": f"{number(row['bound_serving_s'])} ({row['observations']} observations at "
        f"{rate} obs/s, the probe's closed loop)",
    }
    windows = [
        [label, number(row[column]), number(row[end]), bound_parts.get(column, "")]
        for column, _, end, label in GAPS
    ]
    if not math.isnan(row["wall_s"]):
        windows.append(
            [
                f"**{_origin_short(row)} → aggregate**",
                f"**{number(row['wall_s'])}**",
                "",
                f"**{number(row['bound_s'])}** (ratio **{number(row['wall_over_bound'], '.2f')}**)",
            ]
        )
    columns = ["window", "seconds", "at (s after launch)", "bound (s)"]
    lines = [
        f"\n#### Where the wall time went (from the {row['timeline_origin']})\n\n",
        markdown_table(pd.DataFrame(windows, columns=columns)),
    ]
    notes = [n for n in (_envs_note(row), _parts_note(row["startup_parts"])) if n]
    notes += [
        f"{label}: {row[column]}"
        for column, label in (("envs_choice", "envs"), ("dispatch_choice", "dispatch"))
        if row.get(column)
    ]
    lines.extend(f"\n{note[0].upper()}{note[1:]}.\n" for note in notes)
    return "".join(lines)


def _parts_note(parts: str) -> str:
    """The ``startup_parts`` column (``process_start=8 ...``) as the serve job's line says it."""
    if not isinstance(parts, str) or not parts:
        return ""
    seconds = {key: float(value) for key, value in (item.split("=") for item in parts.split())}
    return f"the server's start (its log and the serve job): {describe_parts(seconds)}"
