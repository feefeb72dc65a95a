"""A training run's learning curve, drawn: success against step (both metrics, Wilson bands,
each seed's rate as dots), the HTML page, the report's first screen, and every output of the
`learning_curve` rule. The statistics are `libero_eval.analysis.learning_curve`'s."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from libero_eval.analysis.learning_curve import (
    CAVEAT,
    COMPARE,
    OVERALL,
    REPORT,
    LearningCurve,
    curve_cells,
    curve_markdown,
    learning_curve,
    load_checkpoint,
    overall_rows,
    test_cells,
)
from libero_eval.report.figures import METRIC_LABELS, save_figure
from libero_eval.report.tables import html_page, html_table


def curve_figure(
    curve: LearningCurve, per_seed: Mapping[str, pd.DataFrame] | None = None
) -> Figure:
    """Overall success_once and success_at_end against the step (or the position, where a
    checkpoint has no step), each with its Wilson interval as a band; each seed's own overall
    rate as small dots (`per_seed`: a checkpoint's per_seed.csv, several seeds); the best
    checkpoint ringed."""
    rows = overall_rows(curve.table)
    x = (rows["position"] if curve.ordinal else rows["step"]).to_numpy(float)
    figure = Figure(figsize=(8, 4.6), layout="constrained")
    axes = figure.subplots()
    for color, metric in zip(("C0", "C1"), ("success_once", "success_at_end"), strict=True):
        rate = 100 * rows[metric].to_numpy(float)
        low = 100 * rows[f"{metric}_ci_low"].to_numpy(float)
        high = 100 * rows[f"{metric}_ci_high"].to_numpy(float)
        axes.fill_between(x, low, high, color=color, alpha=0.18, linewidth=0)
        axes.plot(x, rate, marker="o", color=color, label=f"{METRIC_LABELS[metric]} (Wilson band)")
        for position, name in zip(x, rows["checkpoint"], strict=True):
            seeds = (per_seed or {}).get(name)
            if seeds is None or seeds["seed"].nunique() < 2:
                continue
            own = seeds[seeds["level"] == "overall"]
            axes.scatter(
                np.full(len(own), position), 100 * own[metric], s=10, color=color, alpha=0.6
            )
    best = rows.index[rows["checkpoint"] == curve.best["checkpoint"]][0]
    axes.scatter(
        x[best],
        100 * rows.loc[best, curve.metric],
        s=220,
        facecolors="none",
        edgecolors="black",
        label=f"best: {curve.best['checkpoint']}",
        zorder=3,
    )
    if curve.ordinal:
        axes.set_xticks(x, rows["checkpoint"], rotation=30, ha="right", fontsize=8)
        axes.set_xlabel("checkpoint (in the order of checkpoints:)")
    else:
        axes.set_xlabel("training step")
    axes.set_ylim(-3, 103)
    axes.set_ylabel("success rate (%), all suites")
    episodes = int(rows["num_trajectories"].iloc[0])
    axes.set_title(f"{curve.run_id}: {episodes} episodes per checkpoint", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    return figure


def curve_html(curve: LearningCurve, png: bytes, decimals: int) -> str:
    """The page (one file: the figure embedded as a data URI): the figure, the best
    checkpoint, the curve per suite, the paired tests."""
    table, tests = curve.table, curve.tests
    suites = table.sort_values(["suite", "position"], key=lambda c: c.map(_suite_order))
    image = base64.b64encode(png).decode()
    body = [
        f'<p><img src="data:image/png;base64,{image}" alt="learning curve" '
        'style="max-width:100%"></p>',
        f"<p><b>{html.escape(curve.best_line(decimals))}</b></p>",
        "<h2>Success per checkpoint</h2>",
        html_table(curve_cells(suites, decimals, curve.confidence)),
        "<h2>Paired tests on the shared episodes</h2>",
        f"<p>{html.escape(CAVEAT)}</p>",
    ]
    for (kind, metric), rows in tests.groupby(["kind", "metric"], sort=False):
        rows = rows.sort_values("suite", key=lambda c: c.map(_suite_order))
        cells = test_cells(rows, decimals, curve.confidence)
        cells.insert(0, "suite", rows["suite"].to_numpy())
        body += [f"<h3>{html.escape(metric)}: {html.escape(_kind_title(kind, curve))}</h3>"]
        body.append(html_table(cells))
    return html_page(f"Learning curve {curve.run_id}", "\n".join(body))


def _suite_order(suite: str) -> tuple[int, str]:
    return (1 if suite == OVERALL else 0, str(suite))


def _kind_title(kind: str, curve: LearningCurve) -> str:
    if kind == "consecutive":
        return "each checkpoint against the one before it"
    return f"each checkpoint against the best ({curve.best['checkpoint']})"


def overview_rst(curve: LearningCurve, decimals: int) -> str:
    """The report's first screen for a training run (workflow/report/workflow.rst)."""
    cells = curve_cells(overall_rows(curve.table), decimals, curve.confidence)
    title = f"Learning curve of ``{curve.run_id}``"
    lines = [title, "=" * len(title), "", curve.best_line(decimals).replace("`", "``"), ""]
    lines += [".. list-table:: every suite pooled, per checkpoint", "   :header-rows: 1", ""]
    for row in [list(cells.columns), *cells.astype(str).to_numpy().tolist()]:
        cells_rst = [str(c).replace("`", "``").replace("|", "\\|") for c in row]
        lines.append("   * - " + cells_rst[0])
        lines += [f"     - {c}" for c in cells_rst[1:]]
    return "\n".join(lines) + "\n"


def write_learning_curve(
    run_id: str,
    names: Sequence[str],
    summaries: Mapping[str, Sequence[str]],
    outputs: Mapping[str, str | Path],
    metric: str = COMPARE["metric"],
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    n_resamples: int = COMPARE["bootstrap_resamples"],
    seed: int = COMPARE["seed"],
) -> LearningCurve:
    """Every output of the `learning_curve` rule from each checkpoint's summary (`summaries`:
    ``per_suite``, ``episodes``, ``per_seed``, ``checkpoint`` paths, in the order of `names`)."""
    checkpoints = [
        load_checkpoint(name, per_suite, episodes, record)
        for name, per_suite, episodes, record in zip(
            names,
            summaries["per_suite"],
            summaries["episodes"],
            summaries["checkpoint"],
            strict=True,
        )
    ]
    per_seed = {n: pd.read_csv(p) for n, p in zip(names, summaries["per_seed"], strict=True)}
    curve = learning_curve(run_id, checkpoints, metric, confidence, n_resamples, seed)
    paths = {key: Path(path) for key, path in outputs.items()}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    curve.table.to_csv(paths["csv"], index=False)
    curve.tests.to_csv(paths["paired"], index=False)
    paths["markdown"].write_text(curve_markdown(curve, decimals))
    save_figure(curve_figure(curve, per_seed), paths["figure"])
    paths["html"].write_text(curve_html(curve, paths["figure"].read_bytes(), decimals))
    if "overview" in paths:
        paths["overview"].write_text(overview_rst(curve, decimals))
    return curve
