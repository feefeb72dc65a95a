"""The self-test verdict: did the scripted expert succeed through our action conversion?

The expert plans from privileged state and the family's part of the reference server answers
in the model's output space (its statistics, normalization and action layout), so its actions
go through exactly the client conversion a checkpoint's do: statistics, de-normalization,
rotation layout, gripper mapping, chunk handling. A wrong convention there drops its success
to about zero. A family's part may check more of what it receives (a state de-normalized with
the model's statistics against the robot's). The expert reads no images; with privileged
state on, the family's part checks them against its own preprocessing of the raw camera frames
and refuses a mismatch, so image conventions (180-degree flip, camera order, resize/pad) fail
the run loudly instead. What to check when it fails is each family's
(``ReferencePart.selftest_checks``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from libero_eval.policy import families


class SelfTestFailed(RuntimeError):
    """The expert's success rate fell below the threshold."""


def checks(family: str | None = None) -> tuple[str, ...]:
    """What to check when the self-test of ``family`` fails (every registered family's, for
    None), as the families' parts of the reference server name them."""
    named = families.names() if family is None else (family,)
    parts = [families.get(name).reference for name in named]
    return tuple(check for part in parts if part is not None for check in part.selftest_checks)


def verdict(summary_tables: Path | str, min_success_once: float, family: str | None = None) -> str:
    """A one-line pass message, or SelfTestFailed naming what to check (``family``'s)."""
    table = pd.read_parquet(summary_tables)
    overall = table[table["level"] == "overall"].iloc[0]
    rate, n = float(overall["success_once"]), int(overall["num_trajectories"])
    per_suite = ", ".join(
        f"{row.suite} {row.success_once:.0%}"
        for row in table[table["level"] == "suite"].itertuples()
    )
    if rate < min_success_once:
        raise SelfTestFailed(
            f"SELF-TEST FAILED: the scripted expert succeeded on {rate:.0%} of {n} episodes "
            f"({per_suite}); the threshold is {min_success_once:.0%}. Its actions take the same "
            "client conversion as the model's, so a convention is wrong. Check:\n  - "
            + "\n  - ".join(checks(family))
            + "\nDo not start the GPU run until this passes."
        )
    return f"self-test passed: expert success_once {rate:.0%} of {n} episodes ({per_suite})"
