"""The report's efficiency page: each server slot's use of its server (`libero_eval.efficiency`,
from `summary/efficiency.csv`), one row per slot, then the warnings."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from libero_eval.report.tables import _html_table, html_page

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
    "graphs_captured_serving": ("CUDA graphs captured serving", "d"),
    "requests": ("requests", "d"),
    "failed_requests": ("failed", "d"),
    "observations": ("observations", "d"),
}


def _cell(value: object, form: str) -> str:
    if pd.isna(value):
        return "unknown"
    return format(int(value) if form == "d" else value, form)


def efficiency_html(table: pd.DataFrame) -> str:
    """A self-contained page: the slots' figures and each slot's warning."""
    shown = pd.DataFrame(
        {heading: [_cell(v, form) for v in table[key]] for key, (heading, form) in SHOWN.items()}
    )
    body = (
        "<p>Per server slot, its shards merged, over the span from its first policy request "
        "to its last answer. Capacity comes from the server's probe; without one it is "
        "unknown.</p>"
    )
    body += _html_table(shown) if len(table) else "<p>No dispatch logs.</p>"
    warnings = [w for w in table.get("warning", pd.Series(dtype=str)).fillna("") if w]
    if warnings:
        items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
        body += f"<h2>Warnings</h2><ul>{items}</ul>"
    return html_page("Server efficiency per slot", body)


def write_efficiency_html(csv_path: str | Path, html_path: str | Path) -> None:
    """The page from the aggregate step's `summary/efficiency.csv`."""
    table = pd.read_csv(csv_path, keep_default_na=True)
    Path(html_path).parent.mkdir(parents=True, exist_ok=True)
    Path(html_path).write_text(efficiency_html(table))
