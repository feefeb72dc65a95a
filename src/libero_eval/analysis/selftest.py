"""The self-test verdict: did the scripted expert succeed through our action conversion?

The expert plans from privileged state and answers in the model's output space (normalized
rot6d), so its actions go through exactly the client conversion a Cosmos3 checkpoint's do:
stats block, de-normalization, rot6d layout and orthonormalization, gripper mapping, chunk
handling. A wrong convention there drops its success to about zero. For π0.5 the server also
de-normalizes the state it receives with the model's statistics and compares it with the
robot's. The expert reads no images; with privileged state on, the reference server checks
them against its own preprocessing of the raw camera frames and refuses a mismatch, so image
conventions (180-degree flip, camera order, resize/pad) fail the run loudly instead.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


class SelfTestFailed(RuntimeError):
    """The expert's success rate fell below the threshold."""


CHECKS = (
    "policy.cosmos3.normalization / action_stats_path (quantile_rot needs the global_raw block)",
    "rot6d layout: the first two COLUMNS of the rotation matrix",
    "policy.cosmos3.gripper_mapping: g = 1 is open (LIBERO -1)",
    "policy.cosmos3.num_action_chunks / num_frames",
    "π0.5: the checkpoint (policy.pi05.checkpoint or server.sglang.model_path), its "
    "normalization and lerobot_prompt or discrete_state_input, replan_steps",
)


def verdict(summary_tables: Path | str, min_success_once: float) -> str:
    """A one-line pass message, or SelfTestFailed naming what to check."""
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
            + "\n  - ".join(CHECKS)
            + "\nDo not start the GPU run until this passes."
        )
    return f"self-test passed: expert success_once {rate:.0%} of {n} episodes ({per_suite})"
