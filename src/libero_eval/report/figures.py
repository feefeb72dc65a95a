"""Report figures of one run (matplotlib `Figure` objects, never pyplot: no global backend
state is touched)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from libero_eval import settings_schema
from libero_eval.analysis.display import confidence_level
from libero_eval.analysis.throughput import run_start, steps_per_second

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")

METRIC_LABELS = {"success_once": "success once", "success_at_end": "success at end"}


def save_figure(figure: Figure, path: str | Path) -> None:
    """Save as PNG (Agg) with a white background."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")


def _note(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, fontsize=11)


def _task_label(row: pd.Series, width: int = 48) -> str:
    language = row.get("task_language")
    language = language if isinstance(language, str) else ""
    if len(language) > width:
        language = language[: width - 1] + "…"
    return f"{str(row['suite']).removeprefix('libero_')} {int(row['task_id']):>2}: {language}"


def _bars_with_ci(axes, positions, table: pd.DataFrame, horizontal: bool, width: float) -> None:
    """Grouped bars of both success metrics with their confidence intervals."""
    for offset, metric in zip(
        (-width / 2, width / 2), ("success_once", "success_at_end"), strict=True
    ):
        value = 100 * table[metric].to_numpy(float)
        error = 100 * np.vstack(
            [
                table[metric].to_numpy(float) - table[f"{metric}_ci_low"].to_numpy(float),
                table[f"{metric}_ci_high"].to_numpy(float) - table[metric].to_numpy(float),
            ]
        ).clip(min=0)  # a bound may sit a rounding error beyond the rate at 0% and 100%
        bar = axes.barh if horizontal else axes.bar
        error_kw = {"xerr": error} if horizontal else {"yerr": error}
        bar(
            positions + offset,
            value,
            width,
            label=METRIC_LABELS[metric],
            capsize=2,
            error_kw={"elinewidth": 0.8, "ecolor": "0.25"},
            **error_kw,
        )


def success_by_task_figure(
    table: pd.DataFrame, confidence: float = REPORT["confidence_level"]
) -> Figure:
    """Horizontal bars per task: success once / at end with Wilson intervals."""
    tasks = table[table["level"] == "task"].reset_index(drop=True)
    figure = Figure(figsize=(9, 1.6 + 0.42 * max(len(tasks), 1)), layout="constrained")
    axes = figure.add_subplot()
    positions = np.arange(len(tasks))[::-1].astype(float)
    _bars_with_ci(axes, positions, tasks, horizontal=True, width=0.38)
    axes.set_yticks(positions, [_task_label(row) for _, row in tasks.iterrows()], fontsize=8)
    axes.set_xlim(0, 100)
    axes.set_xlabel("success rate (%)")
    axes.set_title(f"Success per task ({confidence_level(confidence)} Wilson CI)")
    axes.grid(axis="x", alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    return figure


def success_by_suite_figure(
    table: pd.DataFrame, confidence: float = REPORT["confidence_level"]
) -> Figure:
    """Bars per suite and overall: success once / at end with Wilson intervals."""
    rows = table[table["level"].isin(["suite", "overall"])].reset_index(drop=True)
    figure = Figure(figsize=(max(5.0, 1.4 * len(rows) + 2), 4.2), layout="constrained")
    axes = figure.add_subplot()
    positions = np.arange(len(rows), dtype=float)
    _bars_with_ci(axes, positions, rows, horizontal=False, width=0.38)
    labels = [
        f"{'all' if row['level'] == 'overall' else row['suite']}\n(n={row['num_trajectories']})"
        for _, row in rows.iterrows()
    ]
    axes.set_xticks(positions, labels, fontsize=9)
    axes.set_ylim(0, 105)
    axes.set_ylabel("success rate (%)")
    axes.set_title(f"Success per suite ({confidence_level(confidence)} Wilson CI)")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    return figure


def first_success_step_figure(episodes: pd.DataFrame) -> Figure:
    """Success rate as a function of the step budget, and the first-success-step histogram."""
    figure = Figure(figsize=(10, 4), layout="constrained")
    curve, histogram = figure.subplots(1, 2)
    steps = episodes["first_success_step"].astype("Float64").to_numpy(float, na_value=np.nan)
    max_step = int(max(episodes["steps"].max() if len(episodes) else 1, 1))
    groups = list(episodes.groupby("suite", sort=True))
    if len(groups) > 1:
        groups.append(("all suites", episodes))
    for name, group in groups:
        first = group["first_success_step"].astype("Float64").to_numpy(float, na_value=np.nan)
        first = np.sort(first[~np.isnan(first)])
        x = np.concatenate([[0], first, [max_step]])
        y = 100 * np.concatenate([[0], np.arange(1, first.size + 1), [first.size]]) / len(group)
        curve.step(x, y, where="post", label=f"{name} (n={len(group)})")
    curve.set_xlim(0, max_step)
    curve.set_ylim(0, 105)
    curve.set_xlabel("episode step")
    curve.set_ylabel("episodes succeeded by this step (%)")
    curve.set_title("Success vs episode step")
    curve.grid(alpha=0.3)
    curve.legend(fontsize=8, loc="upper left")
    successes = steps[~np.isnan(steps)]
    if successes.size:
        histogram.hist(successes, bins=min(30, max(5, successes.size // 2)), color="C2")
    else:
        _note(histogram, "no episode succeeded")
    histogram.set_xlim(0, max_step)
    histogram.set_xlabel("first success step")
    histogram.set_ylabel("episodes")
    histogram.set_title("First-success-step distribution")
    return figure


def latency_over_time_figure(episodes: pd.DataFrame) -> Figure:
    """Per-episode policy latency (mean and p95) against the time it finished, per slot."""
    figure = Figure(figsize=(10, 4), layout="constrained")
    axes = figure.add_subplot()
    measured = episodes.dropna(subset=["policy_latency_mean_s"])
    if len(measured):
        start = run_start(episodes)
        for index, (slot, group) in enumerate(measured.groupby("server_slot", sort=True)):
            minutes = (group["finished_at"] - start) / 60
            color = f"C{index % 10}"
            axes.scatter(
                minutes,
                1000 * group["policy_latency_mean_s"],
                s=30,
                color=color,
                label=f"slot {slot} mean",
            )
            axes.scatter(
                minutes,
                1000 * group["policy_latency_p95_s"],
                s=30,
                color=color,
                marker="v",
                alpha=0.45,
                label=f"slot {slot} p95",
            )
        axes.set_ylim(bottom=0)
        axes.legend(fontsize=8, ncols=2)
    else:
        _note(axes, "no policy calls recorded")
    axes.set_xlabel("minutes since the first episode started")
    axes.set_ylabel("policy latency per episode (ms)")
    axes.set_title("Policy latency over time (per slot)")
    axes.grid(alpha=0.3)
    return figure


def throughput_over_time_figure(episodes: pd.DataFrame, bins: int = 60) -> Figure:
    """Episodes finished over time and env steps per second, per slot and in total."""
    figure = Figure(figsize=(10, 5.5), layout="constrained")
    finished, per_second = figure.subplots(2, 1, sharex=True)
    if len(episodes):
        start = run_start(episodes)
        span = max(float((episodes["finished_at"] - start).max()), 1.0)
        edges = np.linspace(0, span, bins + 1)
        centres = (edges[:-1] + edges[1:]) / 2 / 60
        slots = sorted(episodes["server_slot"].unique())
        series = [(f"slot {s}", episodes[episodes["server_slot"] == s]) for s in slots]
        if len(slots) > 1:
            series.append(("all slots", episodes))
        for index, (label, group) in enumerate(series):
            style = {"color": "black", "linestyle": "--"} if label == "all slots" else {}
            style.setdefault("color", f"C{index % 10}")
            times = np.sort((group["finished_at"] - start).to_numpy(float)) / 60
            rate = len(group) / span * 60
            finished.step(
                np.concatenate([[0], times]),
                np.arange(len(times) + 1),
                where="post",
                label=f"{label}: {rate:.1f} episodes/min",
                **style,
            )
            per_second.plot(centres, steps_per_second(group, edges, start), label=label, **style)
        finished.legend(fontsize=8, loc="upper left")
        finished.set_ylim(bottom=0)
        per_second.set_ylim(bottom=0)
    else:
        _note(finished, "no episodes")
    finished.set_ylabel("episodes finished")
    finished.set_title("Throughput over time")
    finished.grid(alpha=0.3)
    per_second.set_ylabel("env steps / s")
    per_second.set_xlabel("minutes since the first episode started")
    per_second.grid(alpha=0.3)
    return figure
