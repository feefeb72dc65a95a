"""A paired comparison of two runs, drawn: the difference figure, the HTML page, and every
output of the `compare` rule. The statistics are `libero_eval.analysis.compare`'s."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from libero_eval import settings_schema
from libero_eval.analysis.compare import (
    Comparison,
    comparison_markdown,
    difference_cells,
    task_labels,
)
from libero_eval.analysis.display import confidence_level
from libero_eval.report.figures import METRIC_LABELS, _task_label, save_figure
from libero_eval.report.tables import html_page, html_table

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")


def difference_figure(comparison: Comparison) -> Figure:
    """Per-task success of both runs, and the paired difference with its bootstrap interval."""
    c = comparison
    tasks = c.table[c.table["level"] == "task"].reset_index(drop=True)
    overall = c.overall
    rows = max(len(tasks), 1) + 1
    figure = Figure(figsize=(11, 1.9 + 0.36 * rows), layout="constrained")
    rates, differences = figure.subplots(1, 2, sharey=True, width_ratios=(1.15, 1))
    positions = np.arange(len(tasks), 0, -1, dtype=float)
    labels = [_task_label(row, 40) for _, row in tasks.iterrows()]
    all_positions = np.append(positions, 0.0)
    baseline_rates = 100 * np.append(tasks["baseline_rate"], overall["baseline_rate"])
    candidate_rates = 100 * np.append(tasks["candidate_rate"], overall["candidate_rate"])
    markers = ["o"] * len(tasks) + ["D"]  # tasks as dots, the overall rate as diamonds
    for position, a, b in zip(all_positions, baseline_rates, candidate_rates, strict=True):
        rates.plot([a, b], [position + 0.12, position - 0.12], color="0.6", zorder=1)
    for rate, offset, color, name in (
        (baseline_rates, 0.12, "C0", f"baseline {c.baseline}"),
        (candidate_rates, -0.12, "C1", f"candidate {c.candidate}"),
    ):
        for marker in ("o", "D"):
            chosen = np.array(markers) == marker
            rates.scatter(
                rate[chosen],
                all_positions[chosen] + offset,
                color=color,
                marker=marker,
                s=36 if marker == "o" else 50,
                zorder=2,
                label=name if marker == "o" else None,
            )
    rates.set_yticks(all_positions, [*labels, f"all ({overall['n_pairs']} pairs)"], fontsize=8)
    rates.set_xlim(-3, 103)
    rates.set_xlabel(f"{METRIC_LABELS[c.metric]} rate (%)")
    rates.set_title("Success per task")
    figure.legend(loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    rates.grid(axis="x", alpha=0.3)

    difference = 100 * tasks["difference"].to_numpy(float)
    colors = np.where(difference > 0, "C2", np.where(difference < 0, "C3", "0.6"))
    differences.barh(positions, difference, color=colors, height=0.6)
    low, high = 100 * overall["difference_ci_low"], 100 * overall["difference_ci_high"]
    centre = 100 * overall["difference"]
    error = np.clip([[centre - low], [high - centre]], 0, None)
    differences.errorbar([centre], [0], xerr=error, fmt="D", color="black", capsize=4)
    differences.axvline(0, color="black", linewidth=0.8)
    limit = max(10.0, float(np.nanmax(np.abs([*difference, low, high]))) * 1.25)
    for position, value, row in zip(positions, difference, tasks.itertuples(), strict=True):
        differences.annotate(
            f"+{row.gained}/-{row.lost}",
            (value, position),
            xytext=(4 if value >= 0 else -4, 0),
            textcoords="offset points",
            ha="left" if value >= 0 else "right",
            va="center",
            fontsize=7,
            color="0.3",
        )
    differences.set_xlim(-limit, limit)
    differences.set_xlabel("difference, candidate - baseline (points)")
    differences.set_title(
        f"Paired difference ({confidence_level(c.confidence)} bootstrap CI overall)"
    )
    differences.grid(axis="x", alpha=0.3)
    figure.suptitle(
        f"{c.candidate} vs {c.baseline}: {centre:+.1f} points [{low:+.1f}, {high:+.1f}], "
        f"gained {overall['gained']}, lost {overall['lost']}, "
        f"McNemar exact p = {overall['mcnemar_p']:.3g}"
    )
    return figure


def comparison_html(comparison: Comparison, decimals: int = REPORT["decimals"]) -> str:
    """The comparison's tables as one HTML page (for the Snakemake report)."""
    c = comparison
    flipped = c.flipped[
        [*c.flipped.columns[:4], "task_language", "baseline_error", "candidate_error"]
    ]
    summary = c.table[c.table["level"] != "task"]
    tasks = c.table[c.table["level"] == "task"]
    labels = [
        "all" if v == "overall" else s
        for v, s in zip(summary["level"], summary["suite"], strict=True)
    ]
    body = (
        f"<p>Metric <code>{html.escape(c.metric)}</code>; episodes paired by (suite, task, init "
        "state). Difference = candidate - baseline; gained = candidate succeeded where the "
        "baseline failed, lost = the reverse.</p>"
        f"<h2>Runs</h2>{html_table(c.runs)}"
        + "".join(
            f"<p><strong>Warning.</strong> {html.escape(warning)}</p>" for warning in c.warnings
        )
        + "<h2>Overall and suites</h2>"
        + html_table(difference_cells(c, summary, labels, decimals))
        + "<h2>Tasks</h2>"
        + html_table(difference_cells(c, tasks, task_labels(tasks), decimals))
        + f"<h2>Flipped episodes ({len(c.flipped)})</h2>"
        + (html_table(flipped) if len(flipped) else "<p>None.</p>")
        + f"<h2>Unmatched episodes ({len(c.unmatched)})</h2>"
        + (html_table(c.unmatched) if len(c.unmatched) else "<p>None.</p>")
    )
    return html_page(f"Paired comparison: {c.candidate} vs {c.baseline}", body)


def write_comparison(comparison: Comparison, outputs: dict[str, str | Path]) -> None:
    """Write the outputs named in `outputs`: markdown, per_task, flipped, figure, html."""
    for key, path in outputs.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if key == "markdown":
            Path(path).write_text(comparison_markdown(comparison))
        elif key == "per_task":
            comparison.table.to_csv(path, index=False)
        elif key == "flipped":
            comparison.flipped.to_csv(path, index=False)
        elif key == "unmatched":
            comparison.unmatched.to_csv(path, index=False)
        elif key == "figure":
            save_figure(difference_figure(comparison), path)
        elif key == "html":
            Path(path).write_text(comparison_html(comparison))
        else:
            raise ValueError(
                f"unknown comparison output {key!r}; use markdown, per_task, flipped, "
                "unmatched, figure or html"
            )
