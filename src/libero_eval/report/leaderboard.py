"""The leaderboard (`libero_eval.analysis.leaderboard`) as Markdown, CSV and one self-contained HTML
page: a sortable, filterable table per comparison group (inline CSS and JavaScript, nothing
fetched), each group's comparable pairs with `libero-eval compare`, and the runs left out."""

from __future__ import annotations

import datetime
import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

from libero_eval import settings_schema
from libero_eval.analysis.aggregate import METRICS
from libero_eval.analysis.display import is_missing, markdown_table, mean_sd, number, rate_ci
from libero_eval.analysis.leaderboard import build_leaderboard
from libero_eval.report.tables import html_page

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")

_SCRIPT = """
document.querySelectorAll('table.board').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var up = th.dataset.dir !== 'asc'; th.dataset.dir = up ? 'asc' : 'desc';
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.sort, y = b.cells[col].dataset.sort;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return up ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
var filter = document.getElementById('filter');
filter.addEventListener('input', function () {
  var words = filter.value.toLowerCase().split(/\\s+/).filter(Boolean);
  document.querySelectorAll('table.board tbody tr').forEach(function (row) {
    var text = row.textContent.toLowerCase();
    row.style.display = words.every(function (w) { return text.includes(w); }) ? '' : 'none';
  });
});
"""

_STYLE = """
table.board th { cursor: pointer; white-space: nowrap; }
table.board td.num { text-align: right; white-space: nowrap; }
tr.marked td { background: #fff4e5; }
.status { color: #9a3412; font-size: 0.85em; }
input#filter { font-size: 1em; padding: 0.3em; width: 28em; }
"""


def _suites(table: pd.DataFrame) -> list[str]:
    names = sorted({c.split(":")[0] for c in table.columns if c.endswith(":n")} - {"overall"})
    return [*names, "overall"]


def _rate(row: pd.Series, name: str, metric: str, decimals: int = REPORT["decimals"]) -> str:
    low, high = row.get(f"{name}:{metric}_ci_low"), row.get(f"{name}:{metric}_ci_high")
    text = rate_ci(row.get(f"{name}:{metric}", math.nan), low, high, decimals, missing="")
    mean, sd = row.get(f"{name}:{metric}_seed_mean"), row.get(f"{name}:{metric}_seed_std")
    if text and not is_missing(mean):
        seeds = len(str(row["seeds"]).split(","))
        text += f"; {mean_sd(mean, sd, decimals)} over {seeds} seeds"
    return text


def _text(value: Any) -> str:
    """A text cell: "" for a value the run does not have (None, or NaN where other runs of
    the table have it, e.g. a published verdict or a checkpoint hash)."""
    return "" if is_missing(value) else str(value)


def display_rows(table: pd.DataFrame) -> list[list[tuple[str, Any]]]:
    """Per run, (column header, (shown text, sort key)) in page order; shared by MD and HTML."""
    shown = []
    for _, row in table.iterrows():
        cells: list[tuple[str, Any]] = [
            ("run", (row["run"], row["run"])),
            ("status", (row["status"], row["status"])),
            ("family", (_text(row["family"]), _text(row["family"]))),
            ("checkpoint", (_text(row["checkpoint"]), _text(row["checkpoint"]))),
            (
                "checkpoint sha256",
                (_text(row.get("checkpoint_sha256"))[:12], _text(row.get("checkpoint_sha256"))),
            ),
            (
                "step",  # a training run's checkpoint
                (
                    number(row.get("step"), "d", ""),
                    -1 if is_missing(row.get("step")) else row["step"],
                ),
            ),
            ("protocol", (row["protocol"], row["protocol"])),
            ("suites", (row["suites"], row["suites"])),
            ("seeds", (row["seeds"], row["seeds"])),
        ]
        for name in _suites(table):
            for metric in METRICS:
                value = row.get(f"{name}:{metric}", math.nan)
                cells.append(
                    (
                        f"{name} {metric}",
                        (_rate(row, name, metric), -1 if pd.isna(value) else value),
                    )
                )
        published = row.get("published", math.nan)
        cells += [
            (
                "episodes",
                (f"{row['episodes_done']}/{row['episodes_planned']}", row["episodes_done"]),
            ),
            ("errors", (str(row["errors"]), row["errors"])),
            (
                "published",
                (
                    ""
                    if pd.isna(published)
                    else f"{100 * published:.1f}% ({row.get('published_suite')})",
                    -1 if pd.isna(published) else published,
                ),
            ),
            ("verdict", (_text(row.get("published_verdict")), _text(row.get("published_verdict")))),
            ("date", (_text(row["date"]), _text(row["date"]))),
            (
                "wall time",
                (
                    ""
                    if pd.isna(row["wall_time_s"])
                    else str(datetime.timedelta(seconds=round(row["wall_time_s"]))),
                    row["wall_time_s"],
                ),
            ),
            ("obs/s", (number(row["obs_per_s"], ".2f", ""), row["obs_per_s"])),
            # the slots' obs/s as a share of their servers' own capacity (the probe at start):
            # a fraction, shown in percent with a decimal so a small one does not read 0
            (
                "% of capacity",
                (number(row["capacity_fraction"], ".1%", ""), row["capacity_fraction"]),
            ),
        ]
        shown.append(cells)
    return shown


def _pair_text(pair: pd.Series) -> str:
    if "difference" in pair and pd.notna(pair.get("difference")):
        return (
            f"{pair['candidate']} − {pair['baseline']}: {100 * pair['difference']:+.1f} points "
            f"[{100 * pair['difference_ci_low']:+.1f}, {100 * pair['difference_ci_high']:+.1f}] "
            f"over {pair['n_pairs']} paired episodes, McNemar p = {pair['mcnemar_p']:.3g}"
        )
    return f"{pair['baseline']} vs {pair['candidate']}: run `{pair['command']}`"


def leaderboard_markdown(table: pd.DataFrame, pairs: pd.DataFrame, left_out: list[Path]) -> str:
    parts = [
        "# LIBERO leaderboard\n\nOne row per run, from its own summary. Runs are comparable "
        "only within a group: the same episodes under the same protocol.\n"
    ]
    rows = display_rows(table)
    headers = [h for h, _ in rows[0]] if rows else []
    for group, members in table.groupby("group", sort=True):
        cells = [[text for _, (text, _) in rows[index]] for index in members.index]
        parts += [f"\n## {group}\n\n", markdown_table(pd.DataFrame(cells, columns=headers))]
        mine = pairs[pairs["group"] == group] if len(pairs) else pairs
        if len(mine):
            parts.append("\nPaired comparisons:\n\n")
            parts += [f"- {_pair_text(p)}\n" for _, p in mine.iterrows()]
    if left_out:
        parts.append("\n## Runs without a summary (left out)\n\n")
        parts += [f"- `{p}`: not aggregated; finish it with snakemake\n" for p in left_out]
    return "".join(parts)


def leaderboard_html(table: pd.DataFrame, pairs: pd.DataFrame, left_out: list[Path]) -> str:
    rows = display_rows(table)
    body = [
        f"<style>{_STYLE}</style>",
        "<p>One row per run, from its own summary. Runs are comparable only within a group: the "
        "same episodes under the same protocol. Click a column to sort; type to filter.</p>",
        '<p><input id="filter" type="search" placeholder="filter runs, e.g. openpi spatial"></p>',
    ]
    for group, members in table.groupby("group", sort=True):
        headers = [h for h, _ in rows[0]]
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        lines = []
        for index in members.index:
            marked = ' class="marked"' if table.loc[index, "status"] != "ok" else ""
            cells = "".join(
                f'<td data-sort="{html.escape(str(key))}"'
                + (' class="num"' if isinstance(key, int | float) else "")
                + f">{html.escape(str(text))}</td>"
                for _, (text, key) in rows[index]
            )
            lines.append(f"<tr{marked}>{cells}</tr>")
        body.append(
            f"<h2>{html.escape(str(group))}</h2>"
            f'<table class="board"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(lines)}</tbody></table>"
        )
        mine = pairs[pairs["group"] == group] if len(pairs) else pairs
        if len(mine):
            items = "".join(
                f"<li><code>{html.escape(_pair_text(p))}</code></li>" for _, p in mine.iterrows()
            )
            body.append(f"<p>Paired comparisons:</p><ul>{items}</ul>")
    if left_out:
        items = "".join(
            f'<li class="status">{html.escape(str(p))}: no summary</li>' for p in left_out
        )
        body.append(f"<h2>Runs without a summary (left out)</h2><ul>{items}</ul>")
    body.append(f"<script>{_SCRIPT}</script>")
    return html_page("LIBERO leaderboard", "\n".join(body))


def write_leaderboard(
    sources: list[str | Path], out_dir: str | Path, compute_pairs: bool = False
) -> dict[str, Path]:
    """leaderboard.md, leaderboard.csv (every number, unformatted) and leaderboard.html."""
    table, pairs, left_out = build_leaderboard(sources, compute_pairs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f"leaderboard.{k}" for k in ("md", "csv", "html")}
    paths["md"].write_text(leaderboard_markdown(table, pairs, left_out))
    table.to_csv(paths["csv"], index=False)
    paths["html"].write_text(leaderboard_html(table, pairs, left_out))
    return paths
