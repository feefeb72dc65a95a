"""The report's efficiency page: each server slot's use of its server
(`libero_eval.analysis.efficiency`, from `summary/efficiency.csv`), one row per slot, then the
warnings, then where each slot's wall time went (`libero_eval.analysis.timeline`), to the report
itself: the time this page is written."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from libero_eval.analysis.display import number
from libero_eval.analysis.timeline import GAPS, report_window
from libero_eval.eventlog import log_event
from libero_eval.report.tables import html_page, html_table

# efficiency.csv column -> (heading, format); a NaN shows as "unknown"
SHOWN = {
    "slot": ("slot", "d"),
    "server_url": ("server", "s"),
    "shards": ("shards", "s"),
    "obs_per_s": ("obs/s", ".2f"),
    "capacity_obs_per_s": ("capacity obs/s", ".2f"),
    "capacity_fraction": ("of capacity", ".0%"),
    "batch_fill": ("batch fill", ".2f"),
    "server_mean_batch": ("server mean batch (its log)", ".2f"),
    "full_batch_s": ("full batch in the run (s)", ".3f"),
    "probe_full_batch_s": ("full batch at the probe (s)", ".3f"),
    "duty": ("duty", ".2f"),
    "latency_p50_s": ("latency p50 (s)", ".2f"),
    "latency_p95_s": ("latency p95 (s)", ".2f"),
    "envs_waiting": ("envs waiting", ".1f"),
    "envs_stepping": ("envs stepping", ".1f"),
    "env_query_s": ("an env's query, mid-run (s)", ".2f"),
    "env_render_s": ("of it rendering (s)", ".3f"),
    "env_start_render_s": ("rendering before the server was ready (s)", ".3f"),
    "graphs_captured_serving": ("CUDA graphs captured serving", "d"),
    "requests": ("requests", "d"),
    "failed_requests": ("failed", "d"),
    "observations": ("observations", "d"),
}


def _cell(value: object, form: str) -> str:
    return number(value, form, "unknown")


def timeline_html(row: Mapping[str, Any], now: float) -> str:
    """A slot's windows from launch to the report, with the bound's two parts."""
    if not isinstance(row.get("timeline_origin"), str) or not row["timeline_origin"]:
        return ""
    bounds = {"start_to_ready_s": row["start_to_ready_s"], "serving_s": row["bound_serving_s"]}
    rows = [
        [label, _cell(row[column], ".1f"), _cell(row[end], ".1f"), _cell(bounds.get(column), ".1f")]
        for column, _, end, label in GAPS
    ]
    window = report_window(row, now)
    if not math.isnan(window["report_s"]):
        rows.append(
            [
                "aggregate → report",
                _cell(window["report_s"] - row["aggregate_s"], ".1f"),
                _cell(window["report_s"], ".1f"),
                "",
            ]
        )
        rows.append(
            [
                "launch → report",
                _cell(window["report_s"], ".1f"),
                "",
                f"{_cell(window['bound_s'], '.1f')} (ratio {_cell(window['ratio'], '.2f')})",
            ]
        )
    frame = pd.DataFrame(rows, columns=["window", "seconds", "at (s after launch)", "bound (s)"])
    chosen = "".join(
        f"<p>{label}: {html.escape(str(row[column]))}</p>"
        for column, label in (("envs_choice", "Envs"), ("dispatch_choice", "Dispatch"))
        if isinstance(row.get(column), str) and row[column]
    )
    return (
        f"<h2>Where the wall time went, slot {int(row['slot'])}</h2>"
        f"<p>From the {html.escape(row['timeline_origin'])}. The bound is the server's own "
        f"start to ready plus {int(row['observations'])} observations at its closed-loop "
        f"rate ({_cell(row['capacity_obs_per_s'], '.2f')} obs/s, the capacity probe).</p>"
        + html_table(frame)
        + chosen
    )


def efficiency_html(table: pd.DataFrame, now: float | None = None) -> str:
    """A self-contained page: the slots' figures, each slot's warning, and where each slot's
    wall time went up to ``now`` (the report's time; default: the clock)."""
    now = time.time() if now is None else now
    shown = pd.DataFrame(
        {heading: [_cell(v, form) for v in table[key]] for key, (heading, form) in SHOWN.items()}
    )
    body = (
        "<p>Per server slot, its shards merged, over the span from its first policy request "
        "to its last answer. Capacity comes from the server's probe; without one it is "
        "unknown.</p>"
    )
    body += html_table(shown) if len(table) else "<p>No dispatch logs.</p>"
    warnings = [w for w in table.get("warning", pd.Series(dtype=str)).fillna("") if w]
    if warnings:
        items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
        body += f"<h2>Warnings</h2><ul>{items}</ul>"
    if "timeline_origin" in table:
        body += "".join(timeline_html(row, now) for row in table.to_dict("records"))
    return html_page("Server efficiency per slot", body)


def write_efficiency_html(
    csv_path: str | Path, html_path: str | Path, event_log: str | Path | None = None
) -> None:
    """The page from the aggregate step's `summary/efficiency.csv`; with ``event_log``, a
    line per slot: the launch to the report against the bound."""
    table = pd.read_csv(csv_path, keep_default_na=True)
    now = time.time()
    Path(html_path).parent.mkdir(parents=True, exist_ok=True)
    Path(html_path).write_text(efficiency_html(table, now))
    for row in table.to_dict("records") if "timeline_origin" in table else ():
        window = report_window(row, now)
        if not math.isnan(window["report_s"]):
            log_event(
                event_log,
                "report",
                f"slot {int(row['slot'])}: launch → report {window['report_s']:.1f} s against "
                f"a bound of {_cell(window['bound_s'], '.1f')} s: "
                f"{_cell(window['ratio'], '.2f')}x",
            )
