"""How a figure reads in a table: one formatter per kind of cell, shared by the Markdown the
analysis writes (`summary/summary.md`, the comparison, the robustness section) and by the HTML
and reStructuredText of `libero_eval.report`; and a frame of such cells as a Markdown table.

A missing figure (None, NaN, pandas' NA) reads `missing` ("n/a" unless the caller says
otherwise), never "nan"."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

NA = "n/a"


def is_missing(value: Any) -> bool:
    """None, NaN or pandas' NA."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def confidence_level(confidence: float) -> str:
    """0.95 -> "95%", as a table's heading names its intervals."""
    return f"{round(confidence * 100)}%"


def number(value: Any, form: str = ".1f", missing: str = NA) -> str:
    """`value` in `form` (a format spec; "d" takes an integral float too)."""
    if is_missing(value):
        return missing
    return format(int(value) if form == "d" else value, form)


def percent(value: float, decimals: int, missing: str = NA) -> str:
    """A rate as a percent: 0.968 -> "96.8%"."""
    return missing if is_missing(value) else f"{100 * value:.{decimals}f}%"


def rate_ci(value: float, low: float, high: float, decimals: int, missing: str = NA) -> str:
    """A rate with its interval: "96.8% [94.1, 98.4]"."""
    if is_missing(value):
        return missing
    return f"{100 * value:.{decimals}f}% [{100 * low:.{decimals}f}, {100 * high:.{decimals}f}]"


def rate_cells(frame: pd.DataFrame, metric: str, decimals: int) -> list[str]:
    """`rate_ci` of each row's `metric` and its `<metric>_ci_low` / `_ci_high` columns."""
    columns = (frame[metric], frame[f"{metric}_ci_low"], frame[f"{metric}_ci_high"])
    return [rate_ci(v, low, high, decimals) for v, low, high in zip(*columns, strict=True)]


def points(value: float, decimals: int, missing: str = NA) -> str:
    """A difference of rates in signed percentage points: 0.05 -> "+5.0"."""
    return missing if is_missing(value) else f"{100 * value:+.{decimals}f}"


def points_ci(value: float, low: float, high: float, decimals: int) -> str:
    """A difference with its interval: "+5.0 [+1.2, +8.8]"."""
    return f"{points(value, decimals)} [{points(low, decimals)}, {points(high, decimals)}]"


def mean_sd(mean: float, sd: float, decimals: int) -> str:
    """A mean and standard deviation of rates in percent: "96.8 ± 1.2"."""
    if is_missing(mean):
        return NA
    spread = NA if is_missing(sd) else f"{100 * sd:.{decimals}f}"
    return f"{100 * mean:.{decimals}f} ± {spread}"


def p_value(p: float) -> str:
    """A p-value to three significant figures."""
    return number(p, ".3g", "")


def first_line(value: Any, width: int = 120) -> str:
    """The first line of a text cell (an error), at most `width` characters; "" for none."""
    lines = [] if is_missing(value) else str(value).splitlines()
    return lines[0][:width] if lines else ""


def markdown_table(frame: pd.DataFrame) -> str:
    """`frame` (cells as text) as a Markdown table: a header row, `|---|` per column, a row
    per row; a "|" inside a cell is escaped."""

    def row(cells) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |\n"

    lines = [row(frame.columns), "|" + "---|" * len(frame.columns) + "\n"]
    lines += [row(cells) for cells in frame.itertuples(index=False)]
    return "".join(lines)
