"""Why a run's episodes failed: failed episodes grouped by the first line of their error (an
episode without one did not complete its task)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

NO_ERROR = "task not completed (no error)"


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
