"""A training run's learning curve: each checkpoint's success against its training step, the
paired tests between checkpoints, and the best checkpoint.

Every rate, interval and seed spread is the checkpoint's own ``summary/per_suite.csv`` (its
aggregate step's: Wilson intervals, the mean and sample standard deviation of the seeds' own
rates), copied, never recomputed: the curve equals each checkpoint's summary. The checkpoints
evaluated the same planned episodes (one plan for the run), so each pair of checkpoints is
compared on shared episodes with `analysis.compare.compare_runs`: McNemar's exact test on the
discordant pairs and a paired bootstrap interval of the difference, per suite and overall, for
both metrics. Two families of tests:

- ``consecutive``: each checkpoint against the one before it (candidate - baseline: what
  training from one checkpoint to the next changed);
- ``vs_best``: each other checkpoint against the best (best - other).

Several tests on one set of episodes inflate the chance of a false difference, so next to each
raw p-value is its Holm-adjusted one (Holm 1979, step-down: the family-wise error rate is at
most alpha under any dependence), adjusted within its family, metric and suite. The best
checkpoint is chosen on these same episodes, which favours it in its own tests (a winner's
curse): confirm a close call on other init states or seeds.

The best checkpoint: the highest overall rate of the chosen metric (``compare.metric``); a tie
goes to the higher rate of the other metric, then to the earlier checkpoint (fewer training
steps reached it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from libero_eval.analysis.aggregate import METRICS
from libero_eval.analysis.compare import COMPARE, DIFFERENCE_COLUMNS, REPORT, compare_runs
from libero_eval.analysis.display import (
    confidence_level,
    markdown_table,
    mean_sd,
    p_value,
    points_ci,
    rate_cells,
)

OVERALL = "all"  # per_suite.csv's row of every suite pooled
CAVEAT = (
    "Each row is one of several tests on the same episodes: read the Holm-adjusted p-value "
    "(family-wise error over the tests of its family, metric and suite) before calling a "
    "difference real; the raw p-value is the test alone. The best checkpoint was picked on "
    "these episodes, which favours it in its own comparisons: confirm a close call on other "
    "init states or seeds."
)


@dataclass(frozen=True)
class CheckpointResult:
    """One checkpoint's summary, as its aggregate step wrote it."""

    name: str
    step: int | None
    step_source: str
    per_suite: pd.DataFrame  # summary/per_suite.csv
    episodes: pd.DataFrame  # summary/episodes.parquet
    sha256: str | None = None
    path: str | None = None


def load_checkpoint(
    name: str, per_suite: str | Path, episodes: str | Path, record: str | Path
) -> CheckpointResult:
    """A checkpoint's summary files (its ``checkpoint.json`` gives its step and identity)."""
    from libero_eval.store import read_results

    info = json.loads(Path(record).read_text())
    return CheckpointResult(
        name=name,
        step=info.get("step"),
        step_source=info.get("step_source", ""),
        per_suite=pd.read_csv(per_suite),
        episodes=read_results([episodes]),
        sha256=info.get("sha256"),
        path=info.get("path"),
    )


def curve_table(checkpoints: Sequence[CheckpointResult]) -> pd.DataFrame:
    """One row per checkpoint and suite (and ``all``), in the run's order: ``position``
    (1, 2, ...), name, step, then per_suite.csv's columns as they are, the seed spread's
    columns present (NaN for a run of one seed)."""
    frames = []
    for position, c in enumerate(checkpoints, start=1):
        frame = c.per_suite.copy()
        frame.insert(0, "step_source", c.step_source)
        frame.insert(0, "step", pd.array([c.step] * len(frame), dtype="Int64"))
        frame.insert(0, "checkpoint", c.name)
        frame.insert(0, "position", position)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    for metric in METRICS:
        for part in ("_seed_mean", "_seed_std"):
            if f"{metric}{part}" not in table:
                table[f"{metric}{part}"] = math.nan
    if "num_seeds" not in table:
        table["num_seeds"] = 1
    return table


def overall_rows(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["suite"] == OVERALL].reset_index(drop=True)


def best_checkpoint(table: pd.DataFrame, metric: str = COMPARE["metric"]) -> pd.Series:
    """The overall row of the best checkpoint (module docstring: by `metric`, then the other
    metric, then the earlier position)."""
    other = next(m for m in METRICS if m != metric)
    rows = overall_rows(table)
    ranked = rows.sort_values([metric, other, "position"], ascending=[False, False, True])
    return ranked.iloc[0]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (1979), in the order given: the k-th smallest of m
    times (m - k + 1), made monotone, capped at 1; NaN stays NaN."""
    values = np.asarray(p_values, dtype=float)
    finite = np.flatnonzero(~np.isnan(values))
    adjusted = np.full(values.shape, math.nan)
    order = finite[np.argsort(values[finite], kind="stable")]
    m, running = len(order), 0.0
    for k, index in enumerate(order):
        running = max(running, min(1.0, (m - k) * values[index]))
        adjusted[index] = running
    return adjusted.tolist()


def paired_tests(
    checkpoints: Sequence[CheckpointResult],
    best: str,
    confidence: float = REPORT["confidence_level"],
    n_resamples: int = COMPARE["bootstrap_resamples"],
    seed: int = COMPARE["seed"],
) -> pd.DataFrame:
    """Both families of tests (module docstring), per metric, suite and overall: one row each,
    with McNemar's exact p and its Holm adjustment (``p_holm``)."""
    by_name = {c.name: c for c in checkpoints}
    pairs = [("consecutive", a, b) for a, b in zip(checkpoints, checkpoints[1:], strict=False)]
    pairs += [("vs_best", c, by_name[best]) for c in checkpoints if c.name != best]
    rows = []
    for kind, baseline, candidate in pairs:
        for metric in METRICS:
            comparison = compare_runs(
                baseline.episodes,
                candidate.episodes,
                baseline.name,
                candidate.name,
                metric,
                confidence,
                n_resamples,
                seed,
            )
            if len(comparison.unmatched):
                raise ValueError(
                    f"checkpoints {baseline.name} and {candidate.name} do not share "
                    f"{len(comparison.unmatched)} episodes; a training run's checkpoints run one "
                    "plan: rerun the workflow so that each finishes it"
                )
            levels = comparison.table[comparison.table["level"] != "task"]
            for _, row in levels.iterrows():
                rows.append(
                    {
                        "kind": kind,
                        "metric": metric,
                        "suite": row["suite"],
                        "baseline": baseline.name,
                        "baseline_step": baseline.step,
                        "candidate": candidate.name,
                        "candidate_step": candidate.step,
                        **{key: row[key] for key in _TEST_COLUMNS},
                    }
                )
    tests = pd.DataFrame(rows, columns=[*_PAIR_COLUMNS, *_TEST_COLUMNS])
    tests["p_holm"] = math.nan
    for _, family in tests.groupby(["kind", "metric", "suite"], sort=False):
        tests.loc[family.index, "p_holm"] = holm(family["mcnemar_p"].tolist())
    for column in ("baseline_step", "candidate_step"):
        tests[column] = tests[column].astype("Int64")
    return tests


_PAIR_COLUMNS = ["kind", "metric", "suite", "baseline", "baseline_step", "candidate"]
_PAIR_COLUMNS += ["candidate_step"]
_TEST_COLUMNS = ["n_pairs", "baseline_rate", "candidate_rate", *DIFFERENCE_COLUMNS]


def _label(name: str, step: Any) -> str:
    return f"`{name}`" + ("" if pd.isna(step) else f" ({step})")


def curve_cells(table: pd.DataFrame, decimals: int, confidence: float) -> pd.DataFrame:
    """The curve's rows as text (Markdown and the HTML page share them)."""
    level = confidence_level(confidence)
    cells = pd.DataFrame(
        {
            "checkpoint": [f"`{n}`" for n in table["checkpoint"]],
            "step": [("" if pd.isna(s) else str(s)) for s in table["step"]],
            "suite": table["suite"].to_numpy(),
            f"success_once ({level} Wilson)": rate_cells(table, "success_once", decimals),
            f"success_at_end ({level} Wilson)": rate_cells(table, "success_at_end", decimals),
        }
    )
    if (table["num_seeds"].fillna(1) > 1).any():
        for metric in METRICS:
            cells[f"{metric} over seeds"] = [
                mean_sd(mean, sd, decimals)
                for mean, sd in zip(
                    table[f"{metric}_seed_mean"], table[f"{metric}_seed_std"], strict=True
                )
            ]
    cells["episodes"] = table["num_trajectories"].astype(int).astype(str).to_numpy()
    cells["errors"] = table["num_errors"].astype(int).astype(str).to_numpy()
    return cells


def test_cells(tests: pd.DataFrame, decimals: int, confidence: float) -> pd.DataFrame:
    """The paired tests' rows as text."""
    level = confidence_level(confidence)
    columns = ("difference", "difference_ci_low", "difference_ci_high")
    return pd.DataFrame(
        {
            "baseline -> candidate": [
                f"{_label(a, s)} -> {_label(b, t)}"
                for a, s, b, t in zip(
                    tests["baseline"],
                    tests["baseline_step"],
                    tests["candidate"],
                    tests["candidate_step"],
                    strict=True,
                )
            ],
            "pairs": tests["n_pairs"].astype(int).astype(str).to_numpy(),
            f"difference, points ({level} bootstrap CI)": [
                points_ci(d, lo, hi, decimals)
                for d, lo, hi in zip(*(tests[c] for c in columns), strict=True)
            ],
            "gained": tests["gained"].astype(int).astype(str).to_numpy(),
            "lost": tests["lost"].astype(int).astype(str).to_numpy(),
            "McNemar exact p": [p_value(p) for p in tests["mcnemar_p"]],
            "Holm-adjusted p": [p_value(p) for p in tests["p_holm"]],
        }
    )


@dataclass(frozen=True)
class LearningCurve:
    """The curve, the paired tests and the best checkpoint of one training run."""

    run_id: str
    table: pd.DataFrame
    tests: pd.DataFrame
    best: pd.Series
    metric: str
    confidence: float

    @property
    def ordinal(self) -> bool:
        """Whether some checkpoint has no step (the curve is then drawn by position)."""
        return bool(self.table["step"].isna().any())

    def best_line(self, decimals: int) -> str:
        b = self.best
        rate = rate_cells(pd.DataFrame([b]), self.metric, decimals)[0]
        step = "" if pd.isna(b["step"]) else f" (step {b['step']})"
        other = next(m for m in METRICS if m != self.metric)
        return (
            f"Best checkpoint: `{b['checkpoint']}`{step}, {self.metric} {rate} overall; the "
            f"highest overall {self.metric} (compare.metric), a tie broken by {other}, then "
            "by the earlier checkpoint."
        )


def learning_curve(
    run_id: str,
    checkpoints: Sequence[CheckpointResult],
    metric: str = COMPARE["metric"],
    confidence: float = REPORT["confidence_level"],
    n_resamples: int = COMPARE["bootstrap_resamples"],
    seed: int = COMPARE["seed"],
) -> LearningCurve:
    if not checkpoints:
        raise ValueError("a learning curve needs at least one checkpoint (checkpoints:)")
    table = curve_table(checkpoints)
    best = best_checkpoint(table, metric)
    tests = paired_tests(checkpoints, best["checkpoint"], confidence, n_resamples, seed)
    return LearningCurve(run_id, table, tests, best, metric, confidence)


def curve_markdown(curve: LearningCurve, decimals: int = REPORT["decimals"]) -> str:
    """The curve, the best checkpoint and the paired tests (overall, then per suite) as
    Markdown: ``learning_curve.md``."""
    table, tests = curve.table, curve.tests
    episodes = int(overall_rows(table)["num_trajectories"].iloc[0])
    order = "position in checkpoints:" if curve.ordinal else "training step"
    parts = [
        f"# Learning curve `{curve.run_id}`\n\n",
        f"{table['checkpoint'].nunique()} checkpoints by {order}, each on the same "
        f"{episodes} planned episodes; rates and intervals are each checkpoint's "
        "summary/per_suite.csv.\n\n",
        f"**{curve.best_line(decimals)}**\n\n",
        "## Overall\n\n",
        markdown_table(curve_cells(overall_rows(table), decimals, curve.confidence)),
    ]
    if table["suite"].nunique() > 2:  # more than one suite besides `all`
        suites = table[table["suite"] != OVERALL].sort_values(["suite", "position"])
        parts += [
            "\n## Per suite\n\n",
            markdown_table(curve_cells(suites, decimals, curve.confidence)),
        ]
    titles = {
        "consecutive": "each checkpoint against the one before it",
        "vs_best": f"each checkpoint against the best (`{curve.best['checkpoint']}`)",
    }
    parts.append(f"\n## Paired tests on the shared episodes\n\n> {CAVEAT}\n")
    for kind, title in titles.items():
        for metric in METRICS:
            rows = tests[(tests["kind"] == kind) & (tests["metric"] == metric)]
            rows = rows[rows["suite"] == OVERALL]
            if len(rows):
                parts += [f"\n### {metric}: {title}\n\n"]
                parts.append(markdown_table(test_cells(rows, decimals, curve.confidence)))
    parts.append(
        "\nPer-suite tests, both metrics: paired_tests.csv (difference = candidate - "
        "baseline; gained = the candidate succeeded where the baseline failed).\n"
    )
    return "".join(parts)
