"""Paired comparison of two runs that evaluated the same (suite, task, init state) episodes.

Runs share LIBERO's fixed init states, so the comparison is per episode: a pair is the same
(suite, task_id, init_state_id) in both runs. Discordant pairs carry all the information:
`gained` = the candidate succeeded where the baseline failed, `lost` = the reverse. The
difference in success rate is `(gained - lost) / n_pairs`; its significance is McNemar's exact
test (a two-sided binomial test of `gained` out of `gained + lost` at p = 0.5) and its
uncertainty a paired bootstrap interval (episode pairs resampled with replacement, fixed seed).
Episodes that ended with an error count as failures, as in `libero_eval.analysis.aggregate`;
episodes present in only one run are reported, never silently dropped.

A pair is the same episode only when both runs defined their episodes alike: the settings the
schema does not mark `x-fingerprint: false` under `rollout` (protocol, step limit, reset
seeding, camera size, rendering, ...), as each run recorded them (`summary/settings.json`,
written by the aggregate step; for a run aggregated before it, the config in
`report/provenance.json`), and the protocol, reset seeding and seed in its episode rows.
Runs that differ in any are refused, naming each difference, unless the caller allows it
(`--allow-different-settings`, `compare.allow_different_settings`); then each difference is a
warning in the comparison (`libero_eval.analysis.comparable`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from libero_eval import settings_schema
from libero_eval.analysis.aggregate import METRICS
from libero_eval.analysis.comparable import (
    PAIR_KEYS,
    SETTINGS_FILE,
    SettingDifference,
    SettingsDiffer,
    pair_keys,
    setting_differences,
)
from libero_eval.analysis.display import (
    confidence_level,
    first_line,
    markdown_table,
    p_value,
    percent,
    points_ci,
)

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")
COMPARE = settings_schema.defaults("compare")


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (1.0 when there are none)."""
    if lost < 0 or gained < 0:
        raise ValueError(f"discordant counts must be >= 0, got lost={lost}, gained={gained}")
    if lost + gained == 0:
        return 1.0
    return float(binomtest(gained, lost + gained, 0.5, alternative="two-sided").pvalue)


def paired_bootstrap_ci(
    baseline: np.ndarray | pd.Series,
    candidate: np.ndarray | pd.Series,
    confidence: float = REPORT["confidence_level"],
    n_resamples: int = COMPARE["bootstrap_resamples"],
    seed: int = COMPARE["seed"],
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(candidate) - mean(baseline) over paired outcomes.

    Resampling n pairs with replacement only changes how many pairs are gained, lost or tied,
    so the resamples are drawn as multinomial counts of those three kinds: the same
    distribution as resampling indices, in O(n_resamples) whatever the number of pairs.
    """
    a = np.asarray(baseline, dtype=bool)
    b = np.asarray(candidate, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(
            f"baseline and candidate must be 1-D outcome arrays of one length, got shapes "
            f"{a.shape} and {b.shape}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = a.size
    if n == 0:
        return math.nan, math.nan
    gained = int(np.sum(b & ~a))
    lost = int(np.sum(a & ~b))
    probabilities = np.array([gained, lost, n - gained - lost], dtype=float) / n
    counts = np.random.default_rng(seed).multinomial(n, probabilities, size=n_resamples)
    differences = (counts[:, 0] - counts[:, 1]) / n
    alpha = 1 - confidence
    low, high = np.quantile(differences, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def episodes_path(run: str | Path, results_dir: str | Path = "results") -> Path:
    """`results/<run>/summary/episodes.parquet`; `run` may also be the run's directory."""
    path = Path(run)
    run_dir = path if path.is_dir() or len(path.parts) > 1 else Path(results_dir) / path
    return run_dir / "summary" / "episodes.parquet"


def load_episodes(run: str | Path, results_dir: str | Path = "results") -> pd.DataFrame:
    """A finished run's per-episode table, with a clear error when it is missing."""
    from libero_eval.store import read_results

    path = episodes_path(run, results_dir)
    if not path.is_file():
        run_id = Path(run).name
        raise FileNotFoundError(
            f"{path} does not exist: run {run_id!r} has not been aggregated. Produce it with "
            f"`snakemake --cores all --configfile <config of {run_id}> --config run_id={run_id}` "
            "(the aggregate step writes it), or check the run id."
        )
    return read_results([path])


@dataclass(frozen=True)
class Comparison:
    """A paired comparison; `table` has one row per task, per suite and overall (`level`)."""

    baseline: str
    candidate: str
    metric: str
    confidence: float
    pairs: pd.DataFrame
    unmatched: pd.DataFrame
    table: pd.DataFrame
    flipped: pd.DataFrame
    runs: pd.DataFrame
    # episode-defining settings that differ (allowed by the caller), and runs that recorded
    # none (only their episode rows were checked)
    differences: tuple[SettingDifference, ...] = ()
    unrecorded: tuple[str, ...] = field(default=())

    @property
    def overall(self) -> pd.Series:
        return self.table[self.table["level"] == "overall"].iloc[0]

    @property
    def warnings(self) -> list[str]:
        """Why the two runs' episodes may not be comparable: each episode-defining setting in
        which they differ, and runs whose settings were not recorded."""
        messages = [
            f"The runs differ in {d.setting}, which defines the episodes: `{self.baseline}` "
            f"{d.baseline}, `{self.candidate}` {d.candidate}. Differences between them mix "
            "the policies with it; rerun one with the other's setting for a like-for-like "
            "comparison."
            for d in self.differences
        ]
        messages += [
            f"Run `{run}` recorded no settings ({SETTINGS_FILE} or report/provenance.json): "
            "only the protocol, reset seeding and seed of its episodes were compared."
            for run in self.unrecorded
        ]
        return messages


def _check_unique(episodes: pd.DataFrame, name: str, keys: list[str] = PAIR_KEYS) -> None:
    duplicated = episodes[episodes.duplicated(keys, keep=False)]
    if len(duplicated):
        raise ValueError(
            f"run {name!r} has {len(duplicated)} rows sharing a ({', '.join(keys)}), "
            f"e.g. {duplicated[keys].head(3).to_dict('records')}; each episode must count "
            "once: use the aggregated results/<run>/summary/episodes.parquet"
        )


def _run_info(episodes: pd.DataFrame, name: str, metric: str) -> dict:
    def values(column: str) -> str:
        return ", ".join(str(v) for v in sorted(episodes[column].dropna().unique()))

    return {
        "run": name,
        "episodes": len(episodes),
        metric: int(episodes[metric].sum()),
        "errors": int(episodes["error"].notna().sum()),
        "protocol": values("protocol"),
        "seed": values("seed"),
    }


def _difference_row(
    group: pd.DataFrame, confidence: float, n_resamples: int, seed: int
) -> dict[str, float | int]:
    a, b = group["baseline"].to_numpy(bool), group["candidate"].to_numpy(bool)
    n = a.size
    gained, lost = int(np.sum(b & ~a)), int(np.sum(a & ~b))
    low, high = paired_bootstrap_ci(a, b, confidence, n_resamples, seed)
    return {
        "n_pairs": n,
        "baseline_successes": int(a.sum()),
        "candidate_successes": int(b.sum()),
        "baseline_rate": a.mean() if n else math.nan,
        "candidate_rate": b.mean() if n else math.nan,
        "difference": (gained - lost) / n if n else math.nan,
        "difference_ci_low": low,
        "difference_ci_high": high,
        "gained": gained,
        "lost": lost,
        "mcnemar_p": mcnemar_exact(lost, gained),
    }


#: The columns a paired comparison's difference adds to a row (:func:`paired_difference`'s
#: last keys), in the order every results table shows them.
DIFFERENCE_COLUMNS = [
    "difference",
    "difference_ci_low",
    "difference_ci_high",
    "gained",
    "lost",
    "mcnemar_p",
]


def compare_runs(
    baseline: pd.DataFrame,
    candidate: pd.DataFrame,
    baseline_name: str = "baseline",
    candidate_name: str = "candidate",
    metric: str = COMPARE["metric"],
    confidence: float = REPORT["confidence_level"],
    n_resamples: int = COMPARE["bootstrap_resamples"],
    seed: int = COMPARE["seed"],
    *,
    settings: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] | None = None,
    allow_different_settings: bool = COMPARE["allow_different_settings"],
) -> Comparison:
    """Pair episodes by (suite, task_id, init_state_id), and seed for runs with several
    (`pair_keys`), and compare `metric` per pair. `settings`: what each run recorded
    (`recorded_settings`; None: not looked for). Runs whose episode-defining settings differ
    (`setting_differences`) raise `SettingsDiffer` unless `allow_different_settings`."""
    keys = pair_keys(baseline, candidate)
    if metric not in METRICS:
        raise ValueError(f"compare.metric: {metric!r} is not one of {list(METRICS)}")
    differences = setting_differences(baseline, candidate, settings or (None, None))
    if differences and not allow_different_settings:
        lines = "".join(f"\n  {d.line(baseline_name, candidate_name)}" for d in differences)
        raise SettingsDiffer(
            f"runs `{baseline_name}` and `{candidate_name}` are not comparable: settings that "
            f"define their episodes differ:{lines}\nRerun one with the other's settings for a "
            "like-for-like comparison, or compare anyway with --allow-different-settings "
            "(in the workflow: compare.allow_different_settings: true), which lists each "
            "difference in the comparison."
        )
    unrecorded = ()
    if settings is not None:
        names = (baseline_name, candidate_name)
        unrecorded = tuple(name for name, got in zip(names, settings, strict=True) if got is None)
    for name, episodes in ((baseline_name, baseline), (candidate_name, candidate)):
        missing = {*keys, metric, "error", "task_language"} - set(episodes.columns)
        if missing:
            raise ValueError(
                f"run {name!r} lacks columns {sorted(missing)}; pass the aggregated "
                "results/<run>/summary/episodes.parquet"
            )
        _check_unique(episodes, name, keys)

    def side(episodes: pd.DataFrame, tag: str) -> pd.DataFrame:
        columns = {metric: tag, "error": f"{tag}_error", "task_language": f"{tag}_language"}
        if "video_path" in episodes.columns:
            columns["video_path"] = f"{tag}_video"
        if "seed" not in keys and "seed" in episodes.columns:  # for the unmatched table
            columns["seed"] = f"{tag}_seed"
        frame = episodes[[*keys, *columns]].rename(columns=columns)
        frame[tag] = frame[tag].astype(bool)
        return frame.astype({"task_id": int, "init_state_id": int})

    merged = side(baseline, "baseline").merge(
        side(candidate, "candidate"), on=keys, how="outer", indicator=True
    )
    if "seed" not in keys:  # each episode's own seed, whichever run has it
        sides = [
            merged.pop(f"{tag}_seed")
            for tag in ("baseline", "candidate")
            if f"{tag}_seed" in merged
        ]
        if sides:
            merged["seed"] = sides[0].fillna(sides[-1]).astype("Int64")
    only = {"left_only": baseline_name, "right_only": candidate_name}
    own_seed = ["seed"] if "seed" in merged.columns and "seed" not in keys else []
    unmatched = merged[merged["_merge"] != "both"][[*keys, *own_seed, "_merge"]]
    unmatched = unmatched.assign(only_in=unmatched.pop("_merge").map(only).astype(str))
    pairs = merged[merged["_merge"] == "both"].drop(columns=["_merge", *own_seed])
    pairs = pairs.assign(
        task_language=pairs["baseline_language"].fillna(pairs["candidate_language"]),
        baseline=pairs["baseline"].astype(bool),
        candidate=pairs["candidate"].astype(bool),
    ).drop(columns=["baseline_language", "candidate_language"])
    pairs = pairs.sort_values(keys, ignore_index=True)

    rows = []
    for (suite, task_id), group in pairs.groupby(["suite", "task_id"], sort=True):
        rows.append(
            {
                "level": "task",
                "suite": suite,
                "task_id": int(task_id),
                "task_language": group["task_language"].iloc[0],
                **_difference_row(group, confidence, n_resamples, seed),
            }
        )
    for suite, group in pairs.groupby("suite", sort=True):
        rows.append(
            {
                "level": "suite",
                "suite": suite,
                **_difference_row(group, confidence, n_resamples, seed),
            }
        )
    rows.append(
        {
            "level": "overall",
            "suite": "all",
            **_difference_row(pairs, confidence, n_resamples, seed),
        }
    )
    table = pd.DataFrame(rows)
    table["task_id"] = table.get("task_id", pd.Series(dtype="Int64")).astype("Int64")

    flipped = pairs[pairs["baseline"] != pairs["candidate"]].copy()
    flipped.insert(3, "change", np.where(flipped["candidate"], "gained", "lost"))
    runs = pd.DataFrame(
        [
            _run_info(baseline, baseline_name, metric),
            _run_info(candidate, candidate_name, metric),
        ]
    )
    return Comparison(
        baseline=baseline_name,
        candidate=candidate_name,
        metric=metric,
        confidence=confidence,
        pairs=pairs,
        unmatched=unmatched.sort_values(keys, ignore_index=True),
        table=table,
        flipped=flipped.reset_index(drop=True),
        runs=runs,
        differences=tuple(differences),
        unrecorded=unrecorded,
    )


def difference_cells(
    comparison: Comparison, part: pd.DataFrame, labels: list[str], decimals: int
) -> pd.DataFrame:
    """Rows of `comparison.table` as text, the same for the Markdown and the report's page:
    each run's rate (successes / pairs), the difference with its bootstrap interval, gained,
    lost and McNemar's p; `labels` name the rows."""
    c = comparison
    level = confidence_level(c.confidence)

    def rate(side: str) -> list[str]:
        columns = (part[f"{side}_rate"], part[f"{side}_successes"], part["n_pairs"])
        return [f"{percent(r, decimals)} ({k}/{n})" for r, k, n in zip(*columns, strict=True)]

    low, high = part["difference_ci_low"], part["difference_ci_high"]
    return pd.DataFrame(
        {
            "": labels,
            f"{c.baseline} (baseline)": rate("baseline"),
            f"{c.candidate} (candidate)": rate("candidate"),
            f"difference, points ({level} bootstrap CI)": [
                points_ci(d, lo, hi, decimals)
                for d, lo, hi in zip(part["difference"], low, high, strict=True)
            ],
            "gained": part["gained"].to_numpy(),
            "lost": part["lost"].to_numpy(),
            "McNemar exact p": [p_value(p) for p in part["mcnemar_p"]],
        }
    )


def task_labels(tasks: pd.DataFrame) -> list[str]:
    """``libero_spatial 3: pick up the ...`` per task row."""
    columns = (tasks["suite"], tasks["task_id"], tasks["task_language"])
    return [f"{suite} {t}: {language}" for suite, t, language in zip(*columns, strict=True)]


def comparison_markdown(comparison: Comparison, decimals: int = REPORT["decimals"]) -> str:
    """The comparison as Markdown: overall and suites, tasks, flipped and unmatched episodes."""
    c = comparison
    summary = c.table[c.table["level"] != "task"]
    tasks = c.table[c.table["level"] == "task"]
    labels = [
        "**all**" if v == "overall" else s
        for v, s in zip(summary["level"], summary["suite"], strict=True)
    ]
    runs = c.runs.rename(columns={c.metric: "successes"})
    runs["run"] = [f"`{run}`" for run in runs["run"]]
    parts = [
        f"# Paired comparison: `{c.candidate}` vs `{c.baseline}`\n\n",
        f"Metric `{c.metric}`; {c.overall['n_pairs']} episode pairs matched by "
        "(suite, task, init state). Difference = candidate - baseline; gained = candidate "
        "succeeded where baseline failed, lost = the reverse.\n\n",
        markdown_table(runs),
    ]
    parts += [f"\n> **Warning.** {warning}\n" for warning in c.warnings]
    parts += [
        "\n## Overall and suites\n\n",
        markdown_table(difference_cells(c, summary, labels, decimals)),
    ]
    parts += [
        "\n## Tasks\n\n",
        markdown_table(difference_cells(c, tasks, task_labels(tasks), decimals)),
    ]
    parts.append(f"\n## Flipped episodes ({len(c.flipped)})\n\n")
    if len(c.flipped):
        flipped = pd.DataFrame(
            {
                "suite": c.flipped["suite"],
                "task": c.flipped["task_id"],
                "init state": c.flipped["init_state_id"],
                "change": c.flipped["change"],
                "baseline error": c.flipped["baseline_error"].map(first_line),
                "candidate error": c.flipped["candidate_error"].map(first_line),
            }
        )
        parts.append(markdown_table(flipped))
    else:
        parts.append("None: every pair has the same outcome.\n")
    parts.append(f"\n## Unmatched episodes ({len(c.unmatched)})\n\n")
    if len(c.unmatched):
        u = c.unmatched
        unmatched = pd.DataFrame(
            {
                "suite": u["suite"],
                "task": u["task_id"],
                "init state": u["init_state_id"],
                "seed": u["seed"].map(first_line) if "seed" in u else "",
                "only in": [f"`{run}`" for run in u["only_in"]],
            }
        )
        parts += [
            "Present in one run only, left out of every number above.\n\n",
            markdown_table(unmatched),
        ]
    else:
        parts.append("None: both runs evaluated the same episodes.\n")
    return "".join(parts)
