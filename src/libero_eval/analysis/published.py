"""Measured success rates against published figures (`report.published`).

A run may declare, per suite (and `overall`), the success rate a paper or model card reports,
how many episodes it rests on and where it comes from. Each is checked with an exact test:

- With the published episode count `n`, the published figure is itself a binomial sample:
  `round(rate * n)` successes of `n`. Whether the two samples share one success probability is
  then a two-sample question, answered by Fisher's exact test on the 2x2 table (measured and
  published successes and failures). Fisher conditions on the total of successes, which makes
  it slightly conservative; Boschloo's unconditional test is more powerful, but
  `scipy.stats.boschloo_exact` enumerates every table of the two margins (about 5 s at 500
  episodes a side and over 3 minutes at 2,000, an overall row of four LIBERO suites), too slow
  for an aggregate step that runs on every report change.
- Without `n`, the published rate is taken as exact and the measured count is tested against
  it: the two-sided exact binomial test (`scipy.stats.binomtest`). This is how vla-eval judges
  its reproductions ("within 95% CI of reported score", a binomial interval at 500 episodes,
  allenai/vla-evaluation-harness docs/reproductions/running-guide.md); it ignores the published
  figure's own sampling error, so it says "differs" more readily than Fisher's test.

The verdict is "consistent" when p >= alpha, else "differs (p = ...)". A suite in
`report.published` that the run did not evaluate is listed as not evaluated, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from libero_eval import settings_schema
from libero_eval.analysis.display import (
    confidence_level,
    markdown_table,
    p_value,
    percent,
    rate_ci,
)

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")


OVERALL = "overall"
COLUMNS = [
    "suite",
    "metric",
    "successes",
    "trials",
    "measured",
    "measured_ci_low",
    "measured_ci_high",
    "published_rate",
    "published_n",
    "published_successes",
    "source",
    "test",
    "p_value",
    "verdict",
]


def published_test(
    successes: int, trials: int, rate: float, n: int | None = None
) -> tuple[str, float]:
    """(test name, two-sided p-value) of `successes` of `trials` against a published `rate`:
    Fisher's exact test against round(rate * n) of n when `n` is given, else the exact
    binomial test against `rate` taken as exact (module docstring says why)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    if not 0 <= rate <= 1:
        raise ValueError(f"published rate must be a fraction in [0, 1], got {rate}")
    from scipy.stats import binomtest, fisher_exact

    if n is None:
        return "binomial", float(binomtest(successes, trials, rate).pvalue)
    if n < 1:
        raise ValueError(f"published n must be >= 1, got {n}")
    published = round(rate * n)
    table = [[successes, trials - successes], [published, n - published]]
    return "fisher_exact", float(fisher_exact(table).pvalue)


def verdict(p_value: float, alpha: float = REPORT["published_alpha"]) -> str:
    """ "consistent" when p >= alpha, else "differs (p = 0.012)" (p < 0.001 in scientific
    notation, so a tiny p never reads 0.000)."""
    if p_value >= alpha:
        return "consistent"
    shown = f"{p_value:.3f}" if p_value >= 0.001 else f"{p_value:.1e}"
    return f"differs (p = {shown})"


def _measured_row(table: pd.DataFrame, key: str) -> pd.Series | None:
    if key == OVERALL:
        rows = table[table["level"] == "overall"]
    else:
        rows = table[(table["level"] == "suite") & (table["suite"] == key)]
    return rows.iloc[0] if len(rows) else None


def published_checks(
    table: pd.DataFrame,
    published: Mapping[str, Mapping[str, Any]] | None,
    metric: str = REPORT["published_metric"],
    alpha: float = REPORT["published_alpha"],
) -> pd.DataFrame:
    """One row per `published` entry (suites in order, `overall` last): measured successes,
    trials, rate and Wilson interval from the `success_tables` table, the published figure,
    the test, its p-value and the verdict. Empty (with COLUMNS) when nothing is published.

    `overall` is compared with the run's pooled overall row only when the run evaluated exactly
    the suites `published` lists; otherwise its verdict says why it is not comparable."""
    if not published:
        return pd.DataFrame(columns=COLUMNS)
    evaluated = sorted(table.loc[table["level"] == "suite", "suite"])
    listed = sorted(k for k in published if k != OVERALL)
    keys = listed + ([OVERALL] if OVERALL in published else [])
    rows = []
    for key in keys:
        entry = published[key]
        rate, n = float(entry["rate"]), entry.get("n")
        row: dict[str, Any] = {
            "suite": key,
            "metric": metric,
            "published_rate": rate,
            "published_n": n,
            "published_successes": round(rate * n) if n is not None else None,
            "source": entry["source"],
            "test": None,
            "p_value": math.nan,
        }
        measured = _measured_row(table, key)
        if measured is None:
            rows.append({**row, "verdict": "not evaluated"})
            continue
        trials = int(measured["num_trajectories"])
        successes = round(float(measured[metric]) * trials)
        row.update(
            successes=successes,
            trials=trials,
            measured=float(measured[metric]),
            measured_ci_low=float(measured[f"{metric}_ci_low"]),
            measured_ci_high=float(measured[f"{metric}_ci_high"]),
        )
        if key == OVERALL and listed and listed != evaluated:
            missing = sorted(set(listed) - set(evaluated))
            extra = sorted(set(evaluated) - set(listed))
            why = [f"run lacks {', '.join(missing)}"] if missing else []
            why += [f"run adds {', '.join(extra)}"] if extra else []
            rows.append({**row, "verdict": f"not comparable ({'; '.join(why)})"})
            continue
        row["test"], row["p_value"] = published_test(successes, trials, rate, n)
        rows.append({**row, "verdict": verdict(row["p_value"], alpha)})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for column in ("successes", "trials", "published_n", "published_successes"):
        frame[column] = frame[column].astype("Int64")
    return frame


def published_cells(
    checks: pd.DataFrame,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
) -> pd.DataFrame:
    """The checks as text, one row per check, the same for summary.md and the report."""
    rows = []
    for r in checks.itertuples(index=False):
        measured = "not evaluated"
        if not pd.isna(r.trials):
            interval = rate_ci(r.measured, r.measured_ci_low, r.measured_ci_high, decimals)
            measured = f"{interval} ({r.successes}/{r.trials})"
        published = percent(r.published_rate, decimals)
        if not pd.isna(r.published_n):
            published += f" ({r.published_successes}/{r.published_n})"
        test = {"fisher_exact": "Fisher exact", "binomial": "exact binomial"}.get(r.test, "")
        rows.append([r.suite, measured, published, r.source, test, p_value(r.p_value), r.verdict])
    measured_header = f"measured ({confidence_level(confidence)} Wilson CI)"
    columns = ["suite", measured_header, "published", "source", "test", "p", "verdict"]
    return pd.DataFrame(rows, columns=columns)


def published_note(checks: pd.DataFrame, alpha: float) -> str:
    """What the section compares, and how."""
    return (
        f"{checks['metric'].iloc[0]} against the figures in report.published; two-sided exact "
        f"tests (Fisher's with the published n, else binomial against the published rate), "
        f"alpha = {alpha:g}."
    )


def published_markdown(
    checks: pd.DataFrame,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    alpha: float = REPORT["published_alpha"],
) -> str:
    """The "Measured vs published" section of summary.md ("" when nothing is published)."""
    if not len(checks):
        return ""
    return f"## Measured vs published\n\n{published_note(checks, alpha)}\n\n" + markdown_table(
        published_cells(checks, confidence, decimals)
    )
