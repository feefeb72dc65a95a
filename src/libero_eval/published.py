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

import difflib
import html
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from libero_eval import settings_schema

# the config's defaults (the schema's), for callers that give no value
REPORT = settings_schema.defaults("report")

# pandas and scipy.stats are imported where a check runs, not with the module: the config
# check (`check_published_config`) needs neither, and Snakemake imports it at parse time.
if TYPE_CHECKING:
    import pandas as pd

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


def check_published_config(report: Mapping[str, Any], suite_names: list[str]) -> None:
    """Raise ValueError naming the field for what the schema cannot check (it checks each
    entry's rate, n and source): a published key that is neither `overall` nor a registered
    suite (a typo would otherwise never be compared), and a source that is only blanks."""
    for key, entry in (report.get("published") or {}).items():
        field = f"report.published.{key}"
        if key != OVERALL and key not in suite_names:
            close = difflib.get_close_matches(key, suite_names, n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{field}: {key!r} is not a suite name or {OVERALL!r}.{hint}")
        if not str(entry["source"]).strip():
            raise ValueError(f"{field}.source: say where the figure comes from")


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
    import pandas as pd

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


def _cells(checks: pd.DataFrame, decimals: int) -> list[dict[str, str]]:
    """Display strings per check row, shared by the Markdown and HTML tables."""
    import pandas as pd

    cells = []
    for r in checks.itertuples(index=False):
        if pd.isna(r.trials):
            measured = "not evaluated"
        else:
            measured = (
                f"{100 * r.measured:.{decimals}f}% [{100 * r.measured_ci_low:.{decimals}f}, "
                f"{100 * r.measured_ci_high:.{decimals}f}] ({r.successes}/{r.trials})"
            )
        published = f"{100 * r.published_rate:.{decimals}f}%"
        if not pd.isna(r.published_n):
            published += f" ({r.published_successes}/{r.published_n})"
        test = {"fisher_exact": "Fisher exact", "binomial": "exact binomial"}.get(r.test, "")
        p = "" if math.isnan(r.p_value) else f"{r.p_value:.3g}"
        cells.append(
            {
                "suite": r.suite,
                "measured": measured,
                "published": published,
                "source": r.source,
                "test": test,
                "p": p,
                "verdict": r.verdict,
            }
        )
    return cells


def _heading(checks: pd.DataFrame, confidence: float, alpha: float) -> tuple[str, str]:
    metric = checks["metric"].iloc[0]
    level = f"{round(confidence * 100)}%"
    note = (
        f"{metric} against the figures in report.published; two-sided exact tests "
        f"(Fisher's with the published n, else binomial against the published rate), "
        f"alpha = {alpha:g}."
    )
    return f"measured ({level} Wilson CI)", note


def published_markdown(
    checks: pd.DataFrame,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    alpha: float = REPORT["published_alpha"],
) -> str:
    """The "Measured vs published" section of summary.md ("" when nothing is published)."""
    if not len(checks):
        return ""
    measured_header, note = _heading(checks, confidence, alpha)
    lines = [
        "## Measured vs published\n\n",
        f"{note}\n\n",
        f"| suite | {measured_header} | published | source | test | p | verdict |\n",
        "|---|---|---|---|---|---|---|\n",
    ]
    for c in _cells(checks, decimals):
        source = c["source"].replace("|", "\\|")
        lines.append(
            f"| {c['suite']} | {c['measured']} | {c['published']} | {source} | {c['test']} "
            f"| {c['p']} | {c['verdict']} |\n"
        )
    return "".join(lines)


def published_html(
    checks: pd.DataFrame,
    confidence: float = REPORT["confidence_level"],
    decimals: int = REPORT["decimals"],
    alpha: float = REPORT["published_alpha"],
) -> str:
    """The same section as an HTML fragment ("" when nothing is published)."""
    if not len(checks):
        return ""
    import pandas as pd

    measured_header, note = _heading(checks, confidence, alpha)
    frame = pd.DataFrame(_cells(checks, decimals)).rename(columns={"measured": measured_header})
    table = frame.to_html(index=False, border=0, na_rep="", escape=True)
    return f"<h2>Measured vs published</h2><p>{html.escape(note)}</p>{table}"
