"""Robustness: each LIBERO-PRO perturbation suite against its clean suite, in one run.

A perturbation task pairs with a clean task when it is the same task (`libero_eval.suites.
pairing`: matched by name or goal, not a `_task` rewrite, the same number of stored init
states); then its episode with init state k pairs with the clean episode of that task with
init state k, and the paired comparison of `libero_eval.analysis.compare` applies (difference,
McNemar's exact test, paired bootstrap interval), per task and over the suite. LIBERO-PRO
stores its own init states per suite, so a pair shares the task and the init-state index, not
the exact object poses: pairing then gains power where outcomes correlate and, under equal
rates, keeps McNemar's test valid where they do not. Where episodes do not pair (a different
task, another number of init states, or the clean suite not in the run) the report says why
and compares rates unpaired, each with its Wilson interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from libero_eval import settings_schema, suites
from libero_eval.analysis import display
from libero_eval.analysis.aggregate import METRICS, wilson_interval
from libero_eval.analysis.compare import DIFFERENCE_COLUMNS, compare_runs

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")
COMPARE = settings_schema.defaults("compare")

COLUMNS = [
    "suite",
    "base_suite",
    "perturbation",
    "level",
    "task_id",
    "task_language",
    "paired",
    "n_perturbed",
    "n_clean",
    "clean_rate",
    "clean_ci_low",
    "clean_ci_high",
    "perturbed_rate",
    "perturbed_ci_low",
    "perturbed_ci_high",
    *DIFFERENCE_COLUMNS,
    "note",
]


@dataclass(frozen=True)
class Robustness:
    """Rows per perturbation suite: `level` task (clean task ids when paired) and overall."""

    metric: str
    confidence: float
    table: pd.DataFrame

    @property
    def overall(self) -> pd.DataFrame:
        return self.table[self.table["level"] != "task"].reset_index(drop=True)


def _rate(outcomes: pd.Series, confidence: float) -> tuple[int, float, float, float]:
    n = len(outcomes)
    k = int(outcomes.sum())
    low, high = wilson_interval(k, n, confidence)
    return n, (k / n if n else math.nan), low, high


def _unpaired_row(
    suite: str,
    level: str,
    task_id: int | None,
    language: str | None,
    perturbed: pd.Series,
    clean: pd.Series,
    note: str,
    confidence: float,
) -> dict:
    n_p, rate_p, low_p, high_p = _rate(perturbed, confidence)
    n_c, rate_c, low_c, high_c = _rate(clean, confidence)
    return {
        "suite": suite,
        "level": level,
        "task_id": task_id,
        "task_language": language,
        "paired": False,
        "n_perturbed": n_p,
        "n_clean": n_c,
        "clean_rate": rate_c,
        "clean_ci_low": low_c,
        "clean_ci_high": high_c,
        "perturbed_rate": rate_p,
        "perturbed_ci_low": low_p,
        "perturbed_ci_high": high_p,
        "difference": rate_p - rate_c if n_p and n_c else math.nan,
        "note": note,
    }


def robustness(
    episodes: pd.DataFrame,
    metric: str = COMPARE["metric"],
    confidence: float = REPORT["confidence_level"],
    n_resamples: int = COMPARE["bootstrap_resamples"],
    seed: int = COMPARE["seed"],
) -> Robustness:
    """Compare every perturbation suite in `episodes` (one run's rows) with its clean suite."""
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not one of {list(METRICS)}")
    episodes = episodes.assign(
        base_suite=[suites.base_suite(s) for s in episodes["suite"]],
        **{metric: episodes[metric].astype(bool)},
    )
    rows: list[dict] = []
    for suite in dict.fromkeys(episodes["suite"]):
        if not suites.is_perturbation(suite):
            continue
        base = suites.base_suite(suite)
        mine = episodes[episodes["suite"] == suite]
        clean = episodes[episodes["suite"] == base]
        pairing = {t: suites.pairing(suite, t) for t in sorted(set(mine["task_id"]))}
        if clean.empty:
            pairing = {t: (None, f"the clean suite {base} is not in this run") for t in pairing}
        clean_tasks = set(clean["task_id"])
        pairing = {
            t: (c, why)
            if c is None or c in clean_tasks
            else (None, f"its clean task {c} is not in this run")
            for t, (c, why) in pairing.items()
        }
        paired_tasks = {t: c for t, (c, _) in pairing.items() if c is not None}
        suite_rows: list[dict] = []
        if paired_tasks:
            candidate = mine[mine["task_id"].isin(list(paired_tasks))]
            candidate = candidate.assign(
                suite=base, task_id=candidate["task_id"].map(paired_tasks).astype(int)
            )
            baseline = clean[clean["task_id"].isin(list(paired_tasks.values()))]
            comparison = compare_runs(
                baseline, candidate, base, suite, metric, confidence, n_resamples, seed
            )
            no_clean = comparison.unmatched[comparison.unmatched["only_in"] == suite]
            for _, row in comparison.table.iterrows():
                if row["level"] == "suite":
                    continue
                pairs = comparison.pairs
                if row["level"] == "task":
                    pairs = pairs[pairs["task_id"] == row["task_id"]]
                _, _, clean_low, clean_high = _rate(pairs["baseline"], confidence)
                _, _, low, high = _rate(pairs["candidate"], confidence)
                missing = (
                    no_clean
                    if row["level"] != "task"
                    else no_clean[no_clean["task_id"] == row["task_id"]]
                )
                suite_rows.append(
                    {
                        "suite": suite,
                        "level": row["level"],
                        "task_id": row["task_id"] if row["level"] == "task" else None,
                        "task_language": row.get("task_language"),
                        "paired": True,
                        "n_perturbed": int(row["n_pairs"]),
                        "n_clean": int(row["n_pairs"]),
                        "clean_rate": row["baseline_rate"],
                        "clean_ci_low": clean_low,
                        "clean_ci_high": clean_high,
                        "perturbed_rate": row["candidate_rate"],
                        "perturbed_ci_low": low,
                        "perturbed_ci_high": high,
                        "difference": row["difference"],
                        "difference_ci_low": row["difference_ci_low"],
                        "difference_ci_high": row["difference_ci_high"],
                        "gained": int(row["gained"]),
                        "lost": int(row["lost"]),
                        "mcnemar_p": row["mcnemar_p"],
                        "note": (
                            f"{len(missing)} episodes without a clean counterpart in this run "
                            "left out"
                            if len(missing)
                            else ""
                        ),
                    }
                )
        unpaired = {t: why for t, (c, why) in pairing.items() if c is None}
        for task_id, why in unpaired.items():
            part = mine[mine["task_id"] == task_id]
            clean_id = suites.clean_task_id(suite, task_id)
            reference = clean[clean["task_id"] == clean_id] if clean_id is not None else clean
            label = (
                f"clean task {clean_id}"
                if clean_id is not None and len(reference)
                else f"all of {base}"
            )
            if clean_id is not None and reference.empty:
                reference = clean
            language = part["task_language"].dropna()
            suite_rows.append(
                _unpaired_row(
                    suite,
                    "task",
                    int(task_id),
                    language.iloc[0] if len(language) else None,
                    part[metric],
                    reference[metric],
                    f"unpaired ({why}); compared with {label}",
                    confidence,
                )
            )
        if unpaired:
            part = mine[mine["task_id"].isin(list(unpaired))]
            suite_rows.append(
                _unpaired_row(
                    suite,
                    "overall unpaired",
                    None,
                    None,
                    part[metric],
                    clean[metric],
                    f"unpaired ({'; '.join(sorted(set(unpaired.values())))}): "
                    f"{len(unpaired)} task{'s' if len(unpaired) > 1 else ''} against all of "
                    f"{base} in this run",
                    confidence,
                )
            )
        for row in suite_rows:
            row["base_suite"] = base
            row["perturbation"] = suites.perturbation_kind(suite)
        rows += suite_rows
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["task_id"] = table["task_id"].astype("Int64")
    return Robustness(metric=metric, confidence=confidence, table=table)


# ----------------------------------------------------------------------------- outputs


def _rate_cells(t: pd.DataFrame, side: str, decimals: int) -> list[str]:
    """`side`'s rate with its Wilson interval and episode count, one cell per row."""
    columns = (t[f"{side}_rate"], t[f"{side}_ci_low"], t[f"{side}_ci_high"], t[f"n_{side}"])
    return [
        f"{display.rate_ci(r, lo, hi, decimals)} (n={n})"
        for r, lo, hi, n in zip(*columns, strict=True)
    ]


def display_table(result: Robustness, decimals: int = REPORT["decimals"]) -> pd.DataFrame:
    """The table as text, the same for the Markdown and the report's page."""
    t = result.table
    level = display.confidence_level(result.confidence)
    return pd.DataFrame(
        {
            "suite": t["suite"],
            "perturbation": t["perturbation"],
            "task": ["all" if pd.isna(task) else str(task) for task in t["task_id"]],
            "paired": np.where(t["paired"], "paired", "unpaired"),
            f"clean ({level} Wilson)": _rate_cells(t, "clean", decimals),
            f"perturbed ({level} Wilson)": _rate_cells(t, "perturbed", decimals),
            f"difference, points ({level} bootstrap CI if paired)": [
                display.points_ci(d, lo, hi, decimals) if paired else display.points(d, decimals)
                for d, lo, hi, paired in zip(
                    t["difference"],
                    t["difference_ci_low"],
                    t["difference_ci_high"],
                    t["paired"],
                    strict=True,
                )
            ],
            "gained / lost": [
                f"+{int(g)} / -{int(lo)}" if paired else ""
                for g, lo, paired in zip(t["gained"], t["lost"], t["paired"], strict=True)
            ],
            "McNemar exact p": [
                display.p_value(p) if paired else ""
                for p, paired in zip(t["mcnemar_p"], t["paired"], strict=True)
            ],
            "note": t["note"].fillna(""),
        }
    )


INTRO = (
    "Each perturbation suite against its clean suite in this run, metric `{metric}`. "
    "Paired rows match episodes by (clean task, init-state id) and use the paired comparison "
    "(difference = perturbed - clean, McNemar's exact test, paired bootstrap interval). "
    "Unpaired rows say why the episodes do not correspond and compare the two rates, each "
    "with its Wilson interval. Task ids of paired rows are the clean suite's."
)


def robustness_markdown(result: Robustness) -> str:
    frame = display_table(result)
    parts = ["# Robustness: perturbation suites against their clean suites\n\n"]
    parts.append(INTRO.format(metric=result.metric) + "\n\n")
    for title, chosen in (
        ("Per suite", result.table["level"] != "task"),
        ("Per task", result.table["level"] == "task"),
    ):
        parts.append(f"## {title}\n\n")
        part = frame[chosen.to_numpy()]
        if part.empty:
            parts.append("None.\n\n")
            continue
        parts += [display.markdown_table(part), "\n"]
    return "".join(parts)
