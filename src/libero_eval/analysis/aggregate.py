"""Success rates per task, per suite and overall, with Wilson score intervals.

Every (suite, task, init state) counts once: the plan decides which episodes exist, and an
episode missing from the results is an error, not a silently smaller denominator. Episodes
that ended with an error count as failures and are listed separately.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
from scipy.stats import norm

from libero_eval import settings_schema
from libero_eval.analysis.display import (
    confidence_level,
    markdown_table,
    mean_sd,
    number,
    percent,
    rate_cells,
    rate_ci,
)
from libero_eval.analysis.published import published_checks, published_markdown
from libero_eval.rollout.protocols import get_protocol

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")

METRICS = ("success_once", "success_at_end")


def wilson_interval(
    successes: int, n: int, confidence: float = REPORT["confidence_level"]
) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (nan, nan when n == 0)."""
    if n == 0:
        return math.nan, math.nan
    z = float(norm.ppf(0.5 + confidence / 2))
    p = successes / n
    denominator = 1 + z**2 / n
    centre = (p + z**2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def check_complete(episodes: pd.DataFrame, plan: pd.DataFrame) -> None:
    """Every planned episode has exactly one result row (per seed, when the plan has seeds)."""
    keys = ["suite", "task_id", "init_state_id", *(["seed"] if "seed" in plan.columns else [])]
    duplicated = episodes[episodes.duplicated(keys, keep=False)]
    if len(duplicated):
        raise ValueError(
            f"{len(duplicated)} result rows share a ({', '.join(keys)}); each episode "
            f"must count once: {duplicated[keys].head().to_dict('records')}"
        )
    merged = plan[keys].merge(episodes[keys], how="left", indicator=True)
    missing = merged[merged["_merge"] == "left_only"]
    if len(missing):
        raise ValueError(
            f"{len(missing)} planned episodes have no result row, e.g. "
            f"{missing[keys].head().to_dict('records')}; rerun the workflow to finish them"
        )


def _summarize(group: pd.DataFrame, confidence: float) -> dict:
    n = len(group)
    row: dict = {"num_trajectories": n, "num_errors": int(group["error"].notna().sum())}
    for metric in METRICS:
        k = int(group[metric].sum())
        low, high = wilson_interval(k, n, confidence)
        row[metric] = k / n if n else math.nan
        row[f"{metric}_ci_low"] = low
        row[f"{metric}_ci_high"] = high
    row["mean_steps"] = float(group["steps"].mean()) if n else math.nan
    return row


def success_tables(
    episodes: pd.DataFrame, confidence: float = REPORT["confidence_level"]
) -> pd.DataFrame:
    """One table with a `level` column: task rows, suite rows and one overall row."""
    rows = []
    for (suite, task_id), group in episodes.groupby(["suite", "task_id"], sort=True):
        language = group["task_language"].dropna()
        rows.append(
            {
                "level": "task",
                "suite": suite,
                "task_id": int(task_id),
                "task_language": language.iloc[0] if len(language) else None,
                **_summarize(group, confidence),
            }
        )
    for suite, group in episodes.groupby("suite", sort=True):
        rows.append({"level": "suite", "suite": suite, **_summarize(group, confidence)})
    rows.append({"level": "overall", "suite": "all", **_summarize(episodes, confidence)})
    table = pd.DataFrame(rows)
    table["task_id"] = table.get("task_id", pd.Series(dtype="Int64")).astype("Int64")
    return table


def steps_note(protocols: Iterable[str], max_steps: int | None = None) -> str:
    """How the `steps` of the run's episodes count, per episode protocol
    (`libero_eval.rollout.protocols`; `max_steps`: rollout.max_steps, the override of every
    suite's limit): which settle steps are in it, whether episodes stop at success, and where
    episodes run whole action chunks (`run_whole_chunks`), that they may end past the limit."""
    notes = []
    for name in sorted(set(protocols)):
        try:
            protocol = get_protocol(name, max_steps)
        except ValueError:
            continue  # a protocol this package no longer has: nothing to say of it
        limit = (
            f"the limit rollout.max_steps = {max_steps}"
            if max_steps is not None
            else "the suite's step limit (docs/protocols.md)"
        )
        settle = protocol.settle_steps
        text = f"**Steps** ({name} protocol): `steps` counts "
        if settle and protocol.count_settle_steps and protocol.settle_within_limit:
            text += f"the {settle} settle steps after reset and the policy's actions, up to {limit}"
        elif settle and protocol.count_settle_steps:
            text += (
                f"the {settle} settle steps after reset and the policy's actions, which go up "
                f"to {limit} on top of them"
            )
        else:
            text += f"the policy's actions, up to {limit}"
            if settle:
                text += f"; the {settle} settle steps after reset are not counted"
        text += (
            "; an episode stops at its first success."
            if protocol.stop_at_success
            else "; every episode runs to the limit (success_once: success at any step, "
            "success_at_end: at the last)."
        )
        if protocol.run_whole_chunks:
            text += (
                " Episodes run whole action chunks: the limit is checked between chunks, as "
                "the reference does, so an episode can run up to one chunk past it, and mean "
                "steps can exceed the limit (e.g. a limit of 100 with chunks of 16 runs 112)."
            )
        notes.append(text + "\n")
    return "\n".join(notes)


def markdown_summary(
    table: pd.DataFrame,
    run_id: str,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    published: pd.DataFrame | None = None,
    alpha: float = REPORT["published_alpha"],
    seeds_section: str = "",
    steps_section: str = "",
) -> str:
    """A Markdown report: suites and overall first, with how steps count (`steps_note`), then
    the seeds (`seeds_markdown`, several seeds only), measured against published (when
    `published`, from `libero_eval.analysis.published.published_checks`, has rows), then
    every task."""
    level = confidence_level(confidence)

    def rows(part: pd.DataFrame, tasks: list[str]) -> str:
        return markdown_table(
            pd.DataFrame(
                {
                    "suite": part["suite"].to_numpy(),
                    "task": tasks,
                    **{f"{m} ({level} CI)": rate_cells(part, m, decimals) for m in METRICS},
                    "num_trajectories": part["num_trajectories"].to_numpy(),
                    "errors": part["num_errors"].to_numpy(),
                    "mean steps": [number(v, ".0f") for v in part["mean_steps"]],
                }
            )
        )

    suites = table[table["level"].isin(["suite", "overall"])]
    tasks = table[table["level"] == "task"]
    parts = [
        f"# LIBERO evaluation `{run_id}`\n\n## Suites\n\n",
        rows(suites, ["all" if v == "overall" else "(suite)" for v in suites["level"]]),
    ]
    if steps_section:
        parts.append("\n" + steps_section)
    if seeds_section:
        parts.append("\n" + seeds_section)
    if published is not None and len(published):
        parts.append("\n" + published_markdown(published, confidence, decimals, alpha))
    parts.append("\n## Tasks\n\n")
    labels = [
        f"{t}: {lang}" for t, lang in zip(tasks["task_id"], tasks["task_language"], strict=True)
    ]
    parts.append(rows(tasks, labels))
    return "".join(parts)


# ---------------------------------------------------------------- seeds (plan.seeds)


def run_seeds(episodes: pd.DataFrame) -> list[int]:
    """The run seeds of these episodes, ascending (one for a single-seed run)."""
    return sorted(int(s) for s in episodes["seed"].dropna().unique())


def _levels(episodes: pd.DataFrame):
    """(level, suite, task_id, rows) for every task, every suite and overall."""
    for (suite, task_id), group in episodes.groupby(["suite", "task_id"], sort=True):
        yield "task", suite, int(task_id), group
    for suite, group in episodes.groupby("suite", sort=True):
        yield "suite", suite, None, group
    yield "overall", "all", None, episodes


def per_seed_table(
    episodes: pd.DataFrame, confidence: float = REPORT["confidence_level"]
) -> pd.DataFrame:
    """Each seed's own rates (with Wilson intervals) per task, suite and overall: one row per
    (level, suite, task, seed); per_seed.csv."""
    rows = []
    for level, suite, task_id, group in _levels(episodes):
        for seed, part in group.groupby("seed", sort=True):
            rows.append(
                {
                    "level": level,
                    "suite": suite,
                    "task_id": task_id,
                    "seed": int(seed),
                    **_summarize(part, confidence),
                }
            )
    frame = pd.DataFrame(rows)
    if len(frame):
        frame["task_id"] = frame["task_id"].astype("Int64")
    return frame


def with_seed_spread(table: pd.DataFrame, per_seed: pd.DataFrame) -> pd.DataFrame:
    """`table` (success_tables) with, per row, the number of seeds and the mean and sample
    standard deviation (ddof 1) over seeds of each seed's rate, next to the pooled rate and
    its Wilson interval. Unchanged for a single-seed run: it looks as before seeds existed."""
    if per_seed["seed"].nunique() < 2:
        return table
    key = ["level", "suite", "task_id"]
    grouped = per_seed.assign(task_id=per_seed["task_id"].fillna(-1)).groupby(key[:2] + ["task_id"])
    spread = grouped.agg(
        num_seeds=("seed", "nunique"),
        **{f"{m}_seed_mean": (m, "mean") for m in METRICS},
        **{f"{m}_seed_std": (m, "std") for m in METRICS},
    ).reset_index()
    merged = table.assign(task_id=table["task_id"].fillna(-1)).merge(spread, on=key, how="left")
    merged["task_id"] = table["task_id"].astype("Int64").array  # no float round trip
    return merged


def seeds_cells(
    table: pd.DataFrame, per_seed: pd.DataFrame, decimals: int = REPORT["decimals"]
) -> pd.DataFrame | None:
    """The seeds' table as text, the same for summary.md and the report: per suite and
    overall and metric, the pooled rate with its Wilson interval, the mean ± standard
    deviation over seeds and each seed's rate (None for a single-seed run)."""
    seeds = sorted(per_seed["seed"].unique()) if len(per_seed) else []
    if len(seeds) < 2:
        return None
    rows = []
    for _, row in table[table["level"] != "task"].iterrows():
        mine = per_seed[(per_seed["level"] == row["level"]) & (per_seed["suite"] == row["suite"])]
        for metric in METRICS:
            by_seed = dict(zip(mine["seed"], mine[metric], strict=True))
            low, high = row[f"{metric}_ci_low"], row[f"{metric}_ci_high"]
            rows.append(
                [
                    row["suite"],
                    metric,
                    rate_ci(row[metric], low, high, decimals),
                    mean_sd(row[f"{metric}_seed_mean"], row[f"{metric}_seed_std"], decimals),
                    *(percent(by_seed.get(s, math.nan), decimals) for s in seeds),
                ]
            )
    columns = ["suite", "metric", "pooled", "mean ± sd over seeds", *(f"seed {s}" for s in seeds)]
    return pd.DataFrame(rows, columns=columns)


def seeds_markdown(
    table: pd.DataFrame,
    per_seed: pd.DataFrame,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
) -> str:
    """The "Seeds" section of summary.md (`seeds_cells`, "" for a single-seed run)."""
    cells = seeds_cells(table, per_seed, decimals)
    if cells is None:
        return ""
    seeds = sorted(per_seed["seed"].unique())
    return (
        f"## Seeds\n\n{len(seeds)} seeds ({', '.join(map(str, seeds))}), every episode once per "
        f"seed. Pooled: all episodes of all seeds, {confidence_level(confidence)} Wilson CI. "
        "Mean ± sd: over the seeds' own rates (sample standard deviation), in percent.\n\n"
        + markdown_table(cells)
    )


def _published_columns(checks: pd.DataFrame) -> pd.DataFrame:
    """The published figure and its check as `published_*` columns keyed like per_suite.csv
    (the overall row's suite is "all"); published suites the run lacks have no row there."""
    renamed = {c: f"published_{c}" for c in ("source", "test", "p_value", "verdict")}
    frame = checks[checks["trials"].notna()]
    frame = frame[["suite", "published_rate", "published_n", *renamed]].rename(columns=renamed)
    frame["suite"] = frame["suite"].replace({"overall": "all"})
    return frame


def write_summary(
    shard_paths: list[str],
    plan_path: str,
    outputs: dict[str, str],
    run_id: str,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    event_log: str | None = None,
    published: dict | None = None,
    published_metric: str = REPORT["published_metric"],
    published_alpha: float = REPORT["published_alpha"],
    recorded_settings: dict | None = None,
) -> pd.DataFrame:
    """Read shard tables, check them against the plan, write every summary output. With
    `published` (report.published) the Markdown and per_suite.csv also hold the check of
    each published figure (`libero_eval.analysis.published`). `recorded_settings` (the run's
    episode-defining settings, `RunSettings.recorded_settings`) go to `outputs["settings"]`
    as JSON, for `libero_eval.analysis.compare`."""
    import json

    from libero_eval.eventlog import log_event
    from libero_eval.store import read_results, write_frame

    episodes = read_results(shard_paths)
    check_complete(episodes, pd.read_csv(plan_path))
    episodes = episodes.sort_values(["suite", "init_state_id", "task_id"], ignore_index=True)
    if len(run_seeds(episodes)) > 1:
        order = ["suite", "seed", "init_state_id", "task_id"]
        episodes = episodes.sort_values(order, ignore_index=True)
    write_frame(episodes, outputs["episodes"])
    if "settings" in outputs:
        with open(outputs["settings"], "w") as handle:
            json.dump(recorded_settings or {}, handle, indent=2, sort_keys=True)
    per_seed = per_seed_table(episodes, confidence)
    if "per_seed" in outputs:
        per_seed.to_csv(outputs["per_seed"], index=False)
    table = with_seed_spread(success_tables(episodes, confidence), per_seed)
    table.to_parquet(outputs["tables"], index=False)
    table[table["level"] == "task"].drop(columns="level").to_csv(outputs["per_task"], index=False)
    checks = published_checks(table, published, published_metric, published_alpha)
    per_suite = table[table["level"] != "task"].drop(columns=["level", "task_id", "task_language"])
    if len(checks):
        per_suite = per_suite.merge(_published_columns(checks), on="suite", how="left")
    per_suite.to_csv(outputs["per_suite"], index=False)
    seeds_section = seeds_markdown(table, per_seed, confidence, decimals)
    max_steps = ((recorded_settings or {}).get("rollout") or {}).get("max_steps")
    markdown = markdown_summary(
        table,
        run_id,
        confidence,
        decimals,
        checks,
        published_alpha,
        seeds_section,
        steps_note(episodes["protocol"].dropna().unique(), max_steps),
    )
    with open(outputs["markdown"], "w") as handle:
        handle.write(markdown)
    overall = table[table["level"] == "overall"].iloc[0]
    log_event(
        event_log,
        "aggregate",
        f"summary: success_once={overall['success_once']:.4f} "
        f"success_at_end={overall['success_at_end']:.4f} "
        f"num_trajectories={overall['num_trajectories']}\n{markdown}",
    )
    return table
