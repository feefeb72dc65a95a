"""The robustness report drawn: the perturbation x task heatmap, the HTML page, and every
output of the `report_robustness` rule. The statistics are `libero_eval.analysis.robustness`'s."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from libero_eval import suites
from libero_eval.analysis.robustness import INTRO, Robustness, display_table, robustness_markdown
from libero_eval.report.figures import save_figure
from libero_eval.report.tables import html_page


def robustness_html(result: Robustness) -> str:
    frame = display_table(result)
    body = [f"<p>{INTRO.format(metric=result.metric)}</p>"]
    for title, chosen in (
        ("Per suite", result.table["level"] != "task"),
        ("Per task", result.table["level"] == "task"),
    ):
        part = frame[chosen.to_numpy()]
        body.append(f"<h2>{title}</h2>")
        body.append(
            part.to_html(index=False, border=0, escape=True) if len(part) else "<p>None.</p>"
        )
    return html_page("Robustness: perturbation suites vs clean suites", "\n".join(body))


def robustness_figure(result: Robustness) -> Figure:
    """Perturbation x task heatmap of the success difference (points), overall in the last
    column; unpaired cells (rate difference without pairing) carry a '*'."""
    t = result.table
    suite_names = list(dict.fromkeys(t["suite"]))
    tasks = sorted({int(v) for v in t["task_id"].dropna()})
    columns = [*map(str, tasks), "all"]
    values = np.full((max(len(suite_names), 1), len(columns)), np.nan)
    labels = np.full(values.shape, "", dtype=object)
    for _, row in t.iterrows():
        i = suite_names.index(row["suite"])
        if row["level"] == "task":
            j = tasks.index(int(row["task_id"]))
        elif row["level"] == "overall" or not np.isfinite(values[i, -1]):
            j = len(columns) - 1
        else:
            continue
        values[i, j] = 100 * row["difference"]
        if np.isfinite(values[i, j]):
            labels[i, j] = f"{values[i, j]:+.0f}" + ("" if row["paired"] else "*")
    figure = Figure(
        figsize=(5.5 + 0.5 * len(columns), 1.8 + 0.5 * len(suite_names)), layout="constrained"
    )
    axes = figure.subplots()
    if not suite_names:
        axes.text(0.5, 0.5, "no perturbation suites in this run", ha="center", va="center")
        axes.set_axis_off()
        return figure
    axes.set_facecolor("0.85")  # no episodes: grey, unlike a zero difference
    image = axes.imshow(
        np.ma.masked_invalid(values), cmap="RdBu", vmin=-100, vmax=100, aspect="auto"
    )
    for (i, j), text in np.ndenumerate(labels):
        if text:
            dark = abs(values[i, j]) > 60
            axes.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
            )
    axes.set_xticks(range(len(columns)), columns)
    axes.set_yticks(
        range(len(suite_names)),
        [f"{s.removeprefix('libero_')}\n{suites.perturbation_kind(s)}" for s in suite_names],
        fontsize=8,
    )
    axes.axvline(len(columns) - 1.5, color="black", linewidth=1)
    axes.set_xlabel("task (clean task id; * = unpaired, the suite's own id)  |  all")
    figure.colorbar(image, ax=axes, label="perturbed - clean success (points)", shrink=0.8)
    figure.suptitle(f"Robustness: change in {result.metric.replace('_', ' ')} per task")
    return figure


def write_robustness(result: Robustness, outputs: dict[str, str | Path]) -> None:
    """Write the outputs named in `outputs`: figure, html, markdown, csv."""
    for key, path in outputs.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if key == "figure":
            save_figure(robustness_figure(result), path)
        elif key == "html":
            Path(path).write_text(robustness_html(result))
        elif key == "markdown":
            Path(path).write_text(robustness_markdown(result))
        elif key == "csv":
            result.table.to_csv(path, index=False)
        else:
            raise ValueError(f"unknown robustness output {key!r}; use figure, html, markdown, csv")
