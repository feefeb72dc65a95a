"""How well a run used its policy servers, per server slot, from the shards' dispatch logs.

Each rollout shard writes `results/<run>/shards/<shard>.dispatch.json` (the runner's dispatch
log: one `[sent_at, answered_at, observations, ok]` entry per policy request, wall-clock
seconds, and the env seconds spent waiting for actions or stepping). The shards of one slot
are merged; the slot's span runs from its first request sent to its last answer. A slot's
service file (`results/<run>/servers/slot<K>.json`) may hold the server's measured capacity
(`"capacity"`, a probe of latency against batch size); without it the fraction of capacity
is unknown and is reported so, never estimated. A slot's serve log (`logs/<run>/serve/slot<K>.log`)
says whether SGLang ran out of CUDA graphs, how many it captured while serving, and how many
requests each batch it ran while serving merged (`libero_eval.analysis.efficiency_inputs` reads all
three). The server's own pace, its seconds per full batch in the run, comes from the answers
(`libero_eval.analysis.server_pace`).

`slot_efficiency` computes the figures of one slot, `diagnose`
(`libero_eval.analysis.diagnosis`) turns them into a warning with its likely cause and the
setting to change, and `write_efficiency` is the aggregate step's part:
`summary/efficiency.csv`, the "Efficiency" section of `summary/summary.md` and one event-log
line per slot. Each slot's row also says where the run's wall time went, from the workflow's
launch to the aggregate step, against its server's bound (`libero_eval.analysis.timeline`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from libero_eval.analysis.diagnosis import diagnose, merges_requests
from libero_eval.analysis.display import markdown_table, number
from libero_eval.analysis.efficiency_inputs import (
    Capacity,
    ServeLog,
    ServiceTimeline,
    read_capacity,
    read_dispatch_log,
    read_serve_log,
    read_service_timeline,
)
from libero_eval.analysis.env_time import COLUMNS as ENV_COLUMNS
from libero_eval.analysis.env_time import env_time, env_time_text
from libero_eval.analysis.server_pace import full_batch_seconds, server_batches
from libero_eval.analysis.timeline import COLUMNS as TIMELINE_COLUMNS
from libero_eval.analysis.timeline import (
    launch_time,
    slot_timeline,
    timeline_line,
    timeline_markdown,
)
from libero_eval.eventlog import log_event

COLUMNS = (
    "slot",
    "shards",
    "server_url",
    "envs",
    "max_batch_size",
    "server_batch",
    "episodes_run",
    "reused_episodes",
    "requests",
    "failed_requests",
    "observations",
    "observations_ok",
    "span_s",
    "obs_per_s",
    "mean_batch",
    "batch_fill",
    "duty",
    "latency_mean_s",
    "latency_p50_s",
    "latency_p95_s",
    "envs_waiting",
    "envs_stepping",
    "capacity_obs_per_s",
    "capacity_fraction",
    "predicted_latency_s",
    "graphs_captured_serving",
    "graph_capacity_reached",
    "server_batches",
    "server_mean_batch",
    "send_spread_ms",
    "full_batch_s",
    "probe_full_batch_s",
    *ENV_COLUMNS,  # where an env's time per query went (libero_eval.analysis.env_time)
    "cause",
    "warning",
    *TIMELINE_COLUMNS,  # where the wall time went (libero_eval.analysis.timeline)
)


# --------------------------------------------------------------------------- figures


def busy_seconds(intervals: np.ndarray) -> float:
    """Length of the union of [start, end] intervals (rows of a (n, 2) array)."""
    if len(intervals) == 0:
        return 0.0
    intervals = intervals[np.argsort(intervals[:, 0])]
    total, start, end = 0.0, intervals[0, 0], intervals[0, 1]
    for s, e in intervals[1:]:
        if s > end:
            total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    return float(total + end - start)


def slot_efficiency(
    logs: Sequence[Mapping[str, Any]], capacity: Capacity | None, served: ServeLog | None = None
) -> dict:
    """The figures of one slot from its shards' dispatch logs (see `COLUMNS`); rates are NaN
    without requests, the capacity and its fraction NaN without a capacity probe, and the
    CUDA-graph and server-batch figures NaN without a server log that has them."""
    # a request's batch: the server batch it was sent in (several requests where the server
    # merges one-observation requests; without the field, each request its own)
    # (and when it began to leave, once built: NaN in a log of an older runner)
    requests = pd.DataFrame(
        [
            [*r[:4], f"{log['shard']}/{r[4] if len(r) > 4 else i}", r[5] if len(r) > 5 else None]
            for log in logs
            for i, r in enumerate(log["requests"])
        ],
        columns=["sent_at", "answered_at", "observations", "ok", "batch", "left_at"],
    ).astype(
        {"sent_at": float, "answered_at": float, "observations": int, "ok": bool, "left_at": float}
    )
    with_requests = [log for log in logs if log["requests"]] or list(logs)
    row: dict[str, Any] = {
        "slot": int(logs[0]["slot"]),
        "shards": " ".join(sorted(log["shard"] for log in logs)),
        "server_url": logs[0]["server_url"],
        "envs": sum(int(log["envs"]) for log in with_requests),
        "max_batch_size": max(int(log["max_batch_size"]) for log in with_requests),
        "server_batch": max(
            int(log.get("server_batch", log["max_batch_size"])) for log in with_requests
        ),
        "episodes_run": sum(int(log["episodes_run"]) for log in logs),
        "reused_episodes": sum(int(log["reused_episodes"]) for log in logs),
        "requests": len(requests),
        "failed_requests": int((~requests["ok"]).sum()),
        "observations": int(requests["observations"].sum()),
        "observations_ok": int(requests.loc[requests["ok"], "observations"].sum()),
    }
    latency = (requests["answered_at"] - requests["sent_at"]).to_numpy()
    span = float(requests["answered_at"].max() - requests["sent_at"].min()) if len(requests) else 0
    nan = math.nan
    ok_latency = latency[requests["ok"].to_numpy()]
    busy = busy_seconds(requests[["sent_at", "answered_at"]].to_numpy())
    # mean envs in each state over each shard's life (env seconds / the shard's seconds)
    waiting = sum(_per_second(log, "waiting") for log in with_requests)
    stepping = sum(_per_second(log, "stepping") for log in with_requests)
    batches = requests.groupby("batch")["observations"].sum()
    mean_batch = float(batches.mean()) if len(batches) else nan
    # a batch of several requests (merged on the server): from its first request leaving to
    # its last, which a merging server may not wait for
    grouped = requests.groupby("batch")["left_at"]
    spreads = (grouped.max() - grouped.min())[grouped.count() > 1]
    row |= {
        "span_s": span,
        "obs_per_s": row["observations_ok"] / span if span > 0 else nan,
        "mean_batch": mean_batch,
        "batch_fill": mean_batch / row["server_batch"] if row["server_batch"] else nan,
        "duty": busy / span if span > 0 else nan,
        "send_spread_ms": float(spreads.mean()) * 1000 if len(spreads) else nan,
        "latency_mean_s": float(ok_latency.mean()) if len(ok_latency) else nan,
        "latency_p50_s": float(np.percentile(ok_latency, 50)) if len(ok_latency) else nan,
        "latency_p95_s": float(np.percentile(ok_latency, 95)) if len(ok_latency) else nan,
        "envs_waiting": waiting if len(requests) else nan,
        "envs_stepping": stepping if len(requests) else nan,
        "capacity_obs_per_s": capacity.obs_per_s if capacity else nan,
    }
    row["capacity_fraction"] = (
        row["obs_per_s"] / capacity.obs_per_s if capacity and capacity.obs_per_s > 0 else nan
    )
    # The batch the server sees: observations in flight while any is (a request's own when
    # one is in flight at a time; the merged or queued ones when several are).
    in_flight = float((requests["observations"] * latency).sum()) / busy if busy > 0 else nan
    fit = capacity.latency_fit() if capacity else None
    row["predicted_latency_s"] = fit[0] + fit[1] * in_flight if fit and busy > 0 else nan
    # the server's own pace: its full batches in the run against the probe's (server_pace)
    row["full_batch_s"] = full_batch_seconds(requests, row["server_batch"])
    row["probe_full_batch_s"] = fit[0] + fit[1] * row["server_batch"] if fit else nan
    graphs = served if served is not None and served.graphs else None
    row["graphs_captured_serving"] = graphs.captured_serving if graphs else nan
    reached = graphs.capacity_reached if graphs else None
    row["graph_capacity_reached"] = reached if reached is not None else nan
    merged = served.batches if served is not None else ()
    row["server_batches"] = len(merged) if merged else nan
    row["server_mean_batch"] = float(np.mean(merged)) if merged else nan
    if merges_requests(row) and len(requests):
        # its batches are what it merged (its log), else the answers that came together; the
        # shard's one-observation requests need not leave together
        row["mean_batch"] = (
            row["server_mean_batch"]
            if merged
            else float(server_batches(requests)["observations"].mean())
        )
        row["batch_fill"] = row["mean_batch"] / row["server_batch"]
    if len(requests):
        row |= env_time(
            logs, float(requests["sent_at"].min()), float(requests["answered_at"].max())
        )
    else:
        row |= dict.fromkeys(ENV_COLUMNS, nan)
    verdict = diagnose(row)
    row["cause"] = verdict.cause if verdict else ""
    row["warning"] = verdict.message if verdict else ""
    return row


def _per_second(log: Mapping[str, Any], state: str) -> float:
    """Mean envs of a shard in `state` ("waiting", "stepping") over the shard's life."""
    seconds = float(log["ended_at"]) - float(log["started_at"])
    return float(log["env_seconds"][state]) / seconds if seconds > 0 else 0.0


def efficiency_table(
    logs: Sequence[Mapping[str, Any]],
    capacities: Mapping[int, Capacity | None],
    served: Mapping[int, ServeLog | None] | None = None,
    timelines: Mapping[int, ServiceTimeline | None] | None = None,
    launch: float | None = None,
    aggregate: float = math.nan,
) -> pd.DataFrame:
    """One row per slot (`COLUMNS`), its shards' logs merged, sorted by slot; with its
    server's timeline (`timelines`), the workflow's ``launch`` and the ``aggregate`` step's
    time (epochs), where its wall time went (`libero_eval.analysis.timeline`)."""
    by_slot: dict[int, list[Mapping[str, Any]]] = {}
    for log in logs:
        by_slot.setdefault(int(log["slot"]), []).append(log)
    served, timelines = served or {}, timelines or {}
    rows = []
    for s in sorted(by_slot):
        row = slot_efficiency(by_slot[s], capacities.get(s), served.get(s))
        figures = (row["observations"], row["capacity_obs_per_s"])
        rows.append(row | slot_timeline(by_slot[s], timelines.get(s), launch, aggregate, *figures))
    return pd.DataFrame(rows, columns=list(COLUMNS))


# --------------------------------------------------------------------------- text


def _no_requests(row: Mapping[str, Any]) -> str:
    """Why a slot has no figures: all its episodes reused, or a log without its requests."""
    if not row["episodes_run"]:
        return f"no policy requests: all {row['reused_episodes']} episodes reused from the store"
    return (
        f"no policy requests recorded for {row['episodes_run']} episodes run (a dispatch log "
        "without its requests)"
    )


def efficiency_line(row: Mapping[str, Any]) -> str:
    """The one-line event-log summary of a slot."""
    if not row["requests"]:
        return f"slot {row['slot']} efficiency: {_no_requests(row)}"
    capacity = (
        f"{number(row['capacity_fraction'], '.0%')} of {row['capacity_obs_per_s']:.2f} capacity"
        if not math.isnan(row["capacity_obs_per_s"])
        else "capacity unknown"
    )
    return (
        f"slot {row['slot']} efficiency: {row['obs_per_s']:.2f} obs/s ({capacity}), "
        f"batch fill {row['batch_fill']:.2f}, duty {row['duty']:.2f}, "
        f"latency p50 {row['latency_p50_s']:.1f} s p95 {row['latency_p95_s']:.1f} s, "
        f"envs waiting {row['envs_waiting']:.1f} / stepping {row['envs_stepping']:.1f}"
    )


def efficiency_markdown(table: pd.DataFrame) -> str:
    """The summary's "Efficiency" section: a table per slot, then its warning if any."""
    parts = ["\n## Efficiency\n"]
    if table.empty:
        parts.append("\nNo dispatch logs.\n")
    for row in table.to_dict("records"):
        parts.append(f"\n### Slot {row['slot']} ({row['server_url']}; {row['shards']})\n\n")
        if not row["requests"]:
            reason = _no_requests(row)
            parts.append(f"{reason[0].upper()}{reason[1:]}.\n")
            continue
        fraction = number(row["capacity_fraction"], ".0%", "unknown (no capacity probe)")
        figures = [
            ("observations/s", f"{row['obs_per_s']:.2f}"),
            ("capacity obs/s", number(row["capacity_obs_per_s"], ".2f", "unknown")),
            ("fraction of capacity", fraction),
            ("requests (failed)", f"{row['requests']} ({row['failed_requests']})"),
            ("observations (answered ok)", f"{row['observations']} ({row['observations_ok']})"),
            (
                "mean batch / max (fill)",
                f"{row['mean_batch']:.2f} / {max(row['max_batch_size'], row['server_batch'])}"
                f" ({row['batch_fill']:.2f})",
            ),
            ("duty (request in flight)", f"{row['duty']:.2f}"),
            (
                "latency mean / p50 / p95",
                f"{number(row['latency_mean_s'], '.2f')} / {number(row['latency_p50_s'], '.2f')}"
                f" / {number(row['latency_p95_s'], '.2f')} s",
            ),
            ("predicted latency (probe fit)", number(row["predicted_latency_s"], ".2f") + " s"),
            (
                "a full batch, in the run / at the probe",
                f"{number(row['full_batch_s'], '.3f')} / "
                f"{number(row['probe_full_batch_s'], '.3f')} s",
            ),
            (
                "envs waiting / stepping (of envs)",
                f"{row['envs_waiting']:.1f} / {row['envs_stepping']:.1f} (of {row['envs']})",
            ),
            ("span", f"{row['span_s']:.1f} s"),
        ]
        if split := env_time_text(row):
            figures.append(("an env's query, mid-run (in its worker)", split))
        if not math.isnan(row["graphs_captured_serving"]):
            reached = row["graph_capacity_reached"]
            figures.append(
                (
                    "CUDA graphs (serve log)",
                    f"{int(row['graphs_captured_serving'])} captured while serving; capacity "
                    + ("not reached" if math.isnan(reached) else f"reached ({int(reached)})"),
                )
            )
        if not math.isnan(row["send_spread_ms"]):
            figures.append(
                ("a batch's requests leave over (mean)", f"{row['send_spread_ms']:.1f} ms")
            )
        if not math.isnan(row["server_batches"]):
            figures.append(
                (
                    "server batches (serve log)",
                    f"{int(row['server_batches'])}, {row['server_mean_batch']:.2f} requests "
                    f"each on average (of {row['server_batch']})",
                )
            )
        parts.append(markdown_table(pd.DataFrame(figures, columns=["figure", "value"])))
        if row["warning"]:
            parts.append(f"\n**Warning:** {row['warning']}\n")
        parts.append(timeline_markdown(row))
    return "".join(parts)


# --------------------------------------------------------------------------- aggregate step


def write_efficiency(
    dispatch_paths: Sequence[Path | str],
    service_files: Mapping[int, Path | str],
    csv_path: Path | str,
    markdown_path: Path | str | None = None,
    event_log: Path | str | None = None,
    serve_logs: Mapping[int, Path | str] | None = None,
) -> pd.DataFrame:
    """Read the dispatch logs, each slot's capacity (`service_files`: slot -> its service
    file, which may be gone) and its serve log's CUDA-graph and batch lines (`serve_logs`),
    write the CSV, append the "Efficiency" section to the summary Markdown and log a line per
    slot (plus its warning, and where its wall time went: the event log's "workflow launch"
    to now, `libero_eval.analysis.timeline`)."""
    logs = [read_dispatch_log(p) for p in dispatch_paths]
    slots = {int(log["slot"]) for log in logs}
    # the service file as each slot's shards saw it at ready, where the file is gone
    copies = {int(log["slot"]): log["server"] for log in logs if log.get("server")}
    capacities = {
        s: read_capacity(service_files[s], copies.get(s)) if s in service_files else None
        for s in slots
    }
    timelines = {
        s: read_service_timeline(service_files[s], copies.get(s)) if s in service_files else None
        for s in slots
    }
    serve_logs = serve_logs or {}
    served = {s: read_serve_log(serve_logs[s]) if s in serve_logs else None for s in slots}
    table = efficiency_table(
        logs, capacities, served, timelines, launch_time(event_log), aggregate=time.time()
    )
    table.to_csv(csv_path, index=False)
    if markdown_path is not None:
        with open(markdown_path, "a") as handle:
            handle.write(efficiency_markdown(table))
    for row in table.to_dict("records"):
        log_event(event_log, "aggregate", efficiency_line(row))
        if row["warning"]:
            log_event(event_log, "aggregate", f"WARNING: {row['warning']}")
        if row["requests"] and row["timeline_origin"]:
            log_event(event_log, "aggregate", timeline_line(row))
    return table
