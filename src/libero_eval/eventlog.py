"""`logs/<run>/eval_embodiment.log`: the evaluation's milestones, one line each, in order.

Every stage appends to the same file (O_APPEND, one write per line), so the file reads in
time order: server launch, server ready, rollout assignments (`rank -> url`), one
`[libero eval] task_id=.., trial_id=.., success=..` line per episode, then the summary.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# The source of the line that starts each workflow invocation running rollout jobs: from it
# `libero-eval status` counts the invocation's elapsed time and its rate.
WORKFLOW = "workflow"
STAMP = "%Y-%m-%d %H:%M:%S"


def log_event(path: Path | str | None, source: str, message: str) -> None:
    """Append one timestamped milestone line (multi-line messages are indented)."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime(STAMP)
    text = f"{stamp} [{source}] {message.rstrip()}".replace("\n", "\n    ") + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def log_invocation_start(path: Path | str | None, rollout_jobs: int, pid: int) -> None:
    """The line a workflow invocation that runs rollout jobs starts with."""
    message = f"started: {rollout_jobs} rollout job(s) to run (snakemake pid {pid})"
    log_event(path, WORKFLOW, message)


def last_invocation_start(path: Path | str) -> float | None:
    """When the latest invocation logged in `path` started (epoch seconds, to the second);
    None without such a line (or without the file)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    marker = f" [{WORKFLOW}] started: "
    for line in reversed(lines):
        if marker in line:
            try:
                return time.mktime(time.strptime(line.split(marker)[0], STAMP))
            except ValueError:
                continue
    return None


def episode_line(task_id: int, trial_id: int, success: bool, suite: str, steps: int) -> str:
    """The seed's per-episode milestone."""
    return (
        f"[libero eval] task_id={task_id}, trial_id={trial_id}, success={success}, "
        f"suite={suite}, steps={steps}"
    )
