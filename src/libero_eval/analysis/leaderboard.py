"""A leaderboard of finished runs: one row per run, read from each run's own summary.

Every number comes from the run's `summary/summary.parquet` (success rates, Wilson intervals,
the spread over seeds), `summary/per_suite.csv` (the published-figure check), its
`summary/episodes.parquet` (episodes done, errors, protocol, seeds, date, wall time),
`plan.csv` (episodes planned), `report/provenance.json` (family, checkpoint and its hash) and,
where the run recorded it, `summary/efficiency.csv` (`obs_per_s`, `capacity_fraction` per
slot). Nothing is recomputed, so a row equals its run's summary.

Two runs are comparable only when they evaluated the same episodes (suite, task, init state,
seed) under the same protocol (name, step limit, reset seeding): rows are grouped by that, and
each pair of a group gets `libero-eval compare`'s paired test (its command line, or its result
when computed). A run whose summary is older than its plan (stale), whose plan has episodes the
summary lacks (incomplete) or that has errored episodes is marked in its `status`, never mixed
in silently.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from libero_eval.analysis.aggregate import METRICS

SUMMARY = Path("summary") / "summary.parquet"


class LeaderboardError(ValueError):
    """A run that cannot go on the leaderboard; the message names the run and the fix."""


@dataclass
class RunEntry:
    """One run's row and what groups and pairs it."""

    run_dir: Path
    row: dict[str, Any]
    group: str = ""
    status: list[str] = field(default_factory=list)


def find_runs(sources: list[str | Path]) -> tuple[list[Path], list[Path]]:
    """(run directories with a summary, started runs without one). A source is a run directory
    (it must have a summary), a training run's directory (each of its checkpoints,
    `checkpoints/<name>/`, is a run of its own) or a results directory, whose started runs (a
    plan.csv) are all taken, those without a summary listed apart."""
    runs, unsummarized = [], []
    for source in map(Path, sources):
        if not source.is_dir():
            raise LeaderboardError(f"{source}: no such directory (a results/<run> or results/)")
        if (source / "plan.csv").is_file() or (source / "summary").is_dir():
            if not (source / SUMMARY).is_file():
                raise LeaderboardError(
                    f"{source}: no summary ({SUMMARY}): the run has not been aggregated. Finish "
                    "it (rerun snakemake with its config) or leave it off the leaderboard."
                )
            runs.append(source)
            continue
        children = _checkpoint_runs(source) or [
            run
            for child in sorted(source.iterdir())
            for run in ([child] if (child / "plan.csv").is_file() else _checkpoint_runs(child))
        ]
        if not children:
            raise LeaderboardError(f"{source}: holds no runs (no <run>/plan.csv under it)")
        for child in children:
            (runs if (child / SUMMARY).is_file() else unsummarized).append(child)
    return runs, unsummarized


def _checkpoint_runs(directory: Path) -> list[Path]:
    """A training run's checkpoints that have started (`checkpoints/<name>/plan.csv`)."""
    checkpoints = directory / "checkpoints"
    if not checkpoints.is_dir():
        return []
    return sorted(p for p in checkpoints.iterdir() if (p / "plan.csv").is_file())


def run_label(run_dir: Path) -> str:
    """A run's name on the leaderboard: its id, or ``<run>/<checkpoint>`` for a checkpoint of
    a training run (results/<run>/checkpoints/<checkpoint>)."""
    if run_dir.parent.name == "checkpoints":
        return f"{run_dir.parent.parent.name}/{run_dir.name}"
    return run_dir.name


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _efficiency(run_dir: Path) -> tuple[float, float]:
    """Total obs/s over the slots and their mean capacity fraction (nan where not recorded)."""
    path = run_dir / "summary" / "efficiency.csv"
    if not path.is_file():
        return math.nan, math.nan
    frame = pd.read_csv(path)
    obs = frame["obs_per_s"].sum() if "obs_per_s" in frame else math.nan
    capacity = frame["capacity_fraction"].mean() if "capacity_fraction" in frame else math.nan
    return float(obs), float(capacity)


def _episode_set(episodes: pd.DataFrame) -> str:
    keys = ["suite", "task_id", "init_state_id", "seed"]
    rows = sorted(map(tuple, episodes[keys].astype(str).to_numpy().tolist()))
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:10]


def read_run(run_dir: Path) -> RunEntry:
    """One run's leaderboard row, from its own outputs (module docstring)."""
    summary = run_dir / "summary"
    table = pd.read_parquet(summary / "summary.parquet")
    episodes = pd.read_parquet(summary / "episodes.parquet")
    protocols = sorted(episodes["protocol"].dropna().unique())
    if len(protocols) > 1:
        raise LeaderboardError(
            f"{run_dir}: episodes of several protocols ({', '.join(protocols)}) in one run; a "
            "run is judged under one protocol. Rerun it with one rollout.protocol."
        )
    provenance = _read_json(run_dir / "report" / "provenance.json")
    model = provenance.get("model") or {}
    rollout = (provenance.get("config") or {}).get("rollout") or {}
    plan = pd.read_csv(run_dir / "plan.csv")
    seeds = sorted(int(s) for s in episodes["seed"].dropna().unique())
    started = (episodes["finished_at"] - episodes["wall_time_s"]).min()
    finished = episodes["finished_at"].max()
    obs_per_s, capacity = _efficiency(run_dir)
    checkpoint = provenance.get("checkpoint") or {}  # a training run's checkpoint
    row: dict[str, Any] = {
        "run": run_label(run_dir),
        "family": model.get("family"),
        "checkpoint": checkpoint.get("path")
        or model.get("model_dir")
        or (f"reference-{model['reference_policy']}" if model.get("reference_policy") else None),
        "checkpoint_sha256": checkpoint.get("sha256") or model.get("model_index_sha256"),
        "step": checkpoint.get("step"),
        "protocol": protocols[0] if protocols else None,
        "max_steps": rollout.get("max_steps"),
        "reset_seeding": ",".join(sorted(episodes["reset_seeding"].dropna().unique())),
        "suites": ",".join(sorted(table.loc[table["level"] == "suite", "suite"])),
        "seeds": ",".join(map(str, seeds)),
        "episodes_done": len(episodes),
        "episodes_planned": len(plan),
        "errors": int(episodes["error"].notna().sum()),
        "date": datetime.datetime.fromtimestamp(finished, datetime.UTC).strftime("%Y-%m-%d")
        if len(episodes)
        else None,
        "wall_time_s": float(finished - started) if len(episodes) else math.nan,
        "obs_per_s": obs_per_s,
        "capacity_fraction": capacity,
    }
    for _, r in table[table["level"] != "task"].iterrows():
        name = "overall" if r["level"] == "overall" else r["suite"]
        row[f"{name}:n"] = int(r["num_trajectories"])
        for metric in METRICS:
            for part in ("", "_ci_low", "_ci_high", "_seed_mean", "_seed_std"):
                value = r.get(f"{metric}{part}", math.nan)
                row[f"{name}:{metric}{part}"] = float(value) if pd.notna(value) else math.nan
    per_suite = pd.read_csv(summary / "per_suite.csv")
    if "published_rate" in per_suite:
        checked = per_suite[per_suite["published_rate"].notna()].set_index("suite")
        key = "all" if "all" in checked.index else (checked.index[0] if len(checked) else None)
        if key is not None:
            row["published"] = float(checked.loc[key, "published_rate"])
            row["published_suite"] = "overall" if key == "all" else key
            row["published_verdict"] = checked.loc[key, "published_verdict"]
    entry = RunEntry(run_dir, row)
    if (run_dir / "plan.csv").stat().st_mtime > (summary / "summary.parquet").stat().st_mtime:
        entry.status.append("stale: plan.csv is newer than the summary; rerun the workflow")
    if row["episodes_done"] < row["episodes_planned"]:
        entry.status.append(
            f"incomplete: {row['episodes_done']} of {row['episodes_planned']} planned episodes"
        )
    if row["errors"]:
        entry.status.append(f"errors: {row['errors']} episodes ended with an error")
    limit = f"max_steps {row['max_steps']}" if row["max_steps"] else "its step limits"
    protocol = f"{row['protocol']}, {limit}, "
    protocol += f"{row['reset_seeding']} seeding"
    entry.group = f"{protocol}; episodes {_episode_set(episodes)} ({len(episodes)})"
    row["status"] = "; ".join(entry.status) or "ok"
    row["group"] = entry.group
    return entry


def check_group(entries: list[RunEntry]) -> None:
    """A comparison group holds one protocol; a mixed one is refused, naming the runs."""
    protocols = {e.row["protocol"] for e in entries}
    if len(protocols) > 1:
        runs = ", ".join(f"{e.row['run']} ({e.row['protocol']})" for e in entries)
        raise LeaderboardError(
            f"mixed protocols in one comparison group: {runs}. Runs are comparable only under "
            "the same protocol; compare each with a run of its own protocol."
        )


def comparison_pairs(
    entries: list[RunEntry], results_dir: str | Path = "results", compute: bool = False
) -> pd.DataFrame:
    """Each pair of comparable, complete runs: the `libero-eval compare` command, and with
    `compute` its paired test (overall difference, its interval and McNemar's p)."""
    from libero_eval.analysis.compare import compare_runs, load_episodes

    rows = []
    groups: dict[str, list[RunEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.group, []).append(entry)
    for group, members in groups.items():
        check_group(members)
        usable = [m for m in members if not m.status or m.status[0].startswith("errors")]
        for a, b in itertools.combinations(usable, 2):
            row: dict[str, Any] = {
                "group": group,
                "baseline": a.row["run"],
                "candidate": b.row["run"],
                "command": shlex.join(
                    [
                        "libero-eval",
                        "compare",
                        str(a.run_dir),
                        str(b.run_dir),
                    ]
                ),
            }
            if compute:
                result = compare_runs(
                    load_episodes(a.run_dir, results_dir),
                    load_episodes(b.run_dir, results_dir),
                    a.row["run"],
                    b.row["run"],
                    n_resamples=2000,
                ).overall
                row.update(
                    n_pairs=int(result["n_pairs"]),
                    difference=float(result["difference"]),
                    difference_ci_low=float(result["difference_ci_low"]),
                    difference_ci_high=float(result["difference_ci_high"]),
                    mcnemar_p=float(result["mcnemar_p"]),
                )
            rows.append(row)
    return pd.DataFrame(rows)


def build_leaderboard(
    sources: list[str | Path], compute_pairs: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame, list[Path]]:
    """(one row per summarized run, grouped; the comparable pairs; started runs that have no
    summary yet)."""
    runs, unsummarized = find_runs(sources)
    entries = [read_run(run) for run in runs]
    if not entries:
        raise LeaderboardError(
            f"no run with a summary among {', '.join(map(str, sources))}: finish a run first"
        )
    table = pd.DataFrame([e.row for e in entries])
    table = table.sort_values(
        ["group", "overall:success_once", "run"], ascending=[True, False, True], ignore_index=True
    )
    return table, comparison_pairs(entries, compute=compute_pairs), unsummarized
