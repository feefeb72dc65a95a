"""The seeds of one run (plan.seeds): each seed's rate per suite as a figure, and the spread
over seeds as an HTML section of the success table."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from libero_eval import settings_schema
from libero_eval.analysis.aggregate import METRICS, per_seed_table
from libero_eval.analysis.display import confidence_level
from libero_eval.report.figures import METRIC_LABELS
from libero_eval.report.tables import html_table

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")


def success_by_seed_figure(
    episodes: pd.DataFrame, confidence: float = REPORT["confidence_level"]
) -> Figure:
    """Per suite and overall: each seed's success rate as a dot, the mean over seeds as a bar
    and ± one standard deviation as its whisker (one dot per suite for a single seed)."""
    per_seed = per_seed_table(episodes, confidence)
    rows = per_seed[per_seed["level"] != "task"]
    groups = list(dict.fromkeys(rows["suite"]))
    seeds = sorted(rows["seed"].unique())
    figure = Figure(figsize=(max(5.5, 1.8 * len(groups) + 2), 4.4), layout="constrained")
    axes = figure.add_subplot()
    colours = [f"C{i % 10}" for i in range(len(seeds))]
    width = 0.38
    for m, metric in enumerate(METRICS):
        offset = (m - 0.5) * width
        for g, suite in enumerate(groups):
            rates = 100 * rows[rows["suite"] == suite].set_index("seed")[metric]
            sd = float(rates.std(ddof=1)) if len(rates) > 1 else 0.0
            axes.bar(
                g + offset,
                float(rates.mean()),
                width,
                yerr=sd,
                color="0.85" if m == 0 else "0.7",
                edgecolor="0.4",
                capsize=3,
                label=f"{METRIC_LABELS[metric]}: mean ± sd" if g == 0 else None,
            )
            for s, seed in enumerate(seeds):
                if seed in rates.index:
                    jitter = (s - (len(seeds) - 1) / 2) * width / (len(seeds) + 1)
                    axes.plot(
                        g + offset + jitter,
                        rates[seed],
                        "o",
                        color=colours[s],
                        markersize=6,
                        label=f"seed {seed}" if g == 0 and m == 0 else None,
                    )
    labels = [
        f"{suite}\n(n={int(rows[rows['suite'] == suite]['num_trajectories'].sum())})"
        for suite in groups
    ]
    axes.set_xticks(np.arange(len(groups)), labels, fontsize=9)
    axes.set_ylim(0, 105)
    axes.set_ylabel("success rate (%)")
    axes.set_title(
        f"Success per seed ({len(seeds)} seed{'s' if len(seeds) != 1 else ''}; "
        "left bar success once, right success at end)"
    )
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    return figure


def seeds_html(cells: pd.DataFrame | None, confidence: float = REPORT["confidence_level"]) -> str:
    """The seeds section of the success table ("" for a single-seed run): `cells` are the rows
    of summary.md's "Seeds" section (`libero_eval.analysis.aggregate.seeds_cells`)."""
    if cells is None:
        return ""
    note = (
        f"Each episode ran once per seed. Pooled: all episodes of all seeds with the "
        f"{confidence_level(confidence)} Wilson interval; mean ± sd over the seeds' own rates, "
        "in percent."
    )
    return f"<h2>Seeds</h2><p>{html.escape(note)}</p>" + html_table(cells)
