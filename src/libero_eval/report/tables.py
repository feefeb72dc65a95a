"""Self-contained HTML pages and tables of one run: success with intervals, failures by error."""

from __future__ import annotations

import html

import pandas as pd

from libero_eval import settings_schema
from libero_eval.analysis.aggregate import METRICS
from libero_eval.analysis.display import confidence_level, number, rate_cells, rate_ci
from libero_eval.analysis.published import published_cells, published_note

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
figure { display: inline-block; margin: 0.4em; } figcaption { font-size: 0.85em; }
video { width: 256px; background: #000; }
.gained { color: #1a7f37; } .lost { color: #cf222e; }
"""


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page (inline CSS, no external resources)."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
        f"<body><h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def html_table(frame: pd.DataFrame) -> str:
    """`frame` (cells as text, `libero_eval.analysis.display`) as an HTML table."""
    return frame.to_html(index=False, border=0, na_rep="", escape=True)


def success_table_html(
    table: pd.DataFrame,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    published: pd.DataFrame | None = None,
    alpha: float = REPORT["published_alpha"],
    seeds_section: str = "",
) -> str:
    """Suites, overall and every task with both metrics and their Wilson intervals; then the
    seeds' spread (`seeds_section`, `report.seeds.seeds_html`, several seeds only); with
    `published` rows (`libero_eval.analysis.published.published_checks`), measured against published
    after the suites."""
    level = confidence_level(confidence)

    def rows(part: pd.DataFrame, task_label: bool) -> pd.DataFrame:
        frame = pd.DataFrame({"suite": part["suite"]})
        if task_label:
            frame["task"] = [
                f"{t}: {lang}"
                for t, lang in zip(part["task_id"], part["task_language"], strict=True)
            ]
        for metric in METRICS:
            frame[f"{metric} ({level} Wilson CI)"] = rate_cells(part, metric, decimals)
        frame["episodes"] = part["num_trajectories"].to_numpy()
        frame["errors"] = part["num_errors"].to_numpy()
        frame["mean steps"] = part["mean_steps"].round(0).to_numpy()
        return frame

    suites = table[table["level"] != "task"]
    tasks = table[table["level"] == "task"]
    measured = ""  # measured vs published, the rows of summary.md's section
    if published is not None and len(published):
        note = html.escape(published_note(published, alpha))
        cells = html_table(published_cells(published, confidence, decimals))
        measured = f"<h2>Measured vs published</h2><p>{note}</p>{cells}"
    body = (
        f"<h2>Suites and overall</h2>{html_table(rows(suites, False))}"
        + seeds_section
        + measured
        + f"<h2>Tasks</h2>{html_table(rows(tasks, True))}"
    )
    return html_page("Success per task and suite", body)


def success_overview_rst(
    table: pd.DataFrame,
    run_id: str,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    steps: str = "",
) -> str:
    """The report's first screen (reStructuredText, included by workflow/report/workflow.rst):
    each suite's and the overall success with their Wilson intervals, episodes, errors and
    mean steps, and how steps count (`steps`, `libero_eval.analysis.aggregate.steps_note`)."""
    level = confidence_level(confidence)

    def cell(text: object) -> str:
        return str(text).replace("|", "\\|").replace("*", "\\*")

    lines = [
        f"Result of run ``{run_id}``",
        "=" * (len(run_id) + 18),
        "",
        f".. list-table:: success per suite and overall ({level} Wilson interval)",
        "   :header-rows: 1",
        "",
    ]
    header = ["suite", "success_once", "success_at_end", "episodes", "errors", "mean steps"]
    rows = [header]
    for _, r in table[table["level"] != "task"].iterrows():
        rows.append(
            [
                "all" if r["level"] == "overall" else r["suite"],
                *(rate_ci(r[m], r[f"{m}_ci_low"], r[f"{m}_ci_high"], decimals) for m in METRICS),
                r["num_trajectories"],
                r["num_errors"],
                number(r["mean_steps"], ".0f"),
            ]
        )
    for row in rows:
        lines += [f"   * - {cell(row[0])}", *(f"     - {cell(value)}" for value in row[1:])]
    lines.append("")
    if steps:  # Markdown's `code` is reStructuredText's ``code``
        lines += [steps.replace("`", "``").strip(), ""]
    lines += ["Every task, the charts and the episodes: the menu, from Success_ on.", ""]
    return "\n".join(lines)


def failures_html(failures: pd.DataFrame, num_episodes: int) -> str:
    shown = failures.assign(
        share_of_failures=failures["share_of_failures"].map(lambda v: f"{100 * v:.1f}%")
    )
    total = int(failures["episodes"].sum()) if len(failures) else 0
    body = f"<p>{total} of {num_episodes} episodes failed (success_once false).</p>"
    body += html_table(shown) if len(failures) else "<p>No failures.</p>"
    return html_page("Failures grouped by error", body)
