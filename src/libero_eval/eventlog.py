"""`logs/<run>/eval_embodiment.log`: the evaluation's milestones, one line each, in order.

Every stage appends to the same file (O_APPEND, one write per line), so the file reads in
time order: server launch, server ready, rollout assignments (`rank -> url`), one
`[libero eval] task_id=.., trial_id=.., success=..` line per episode, then the summary.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

# The source of the "workflow launch" line that starts each workflow invocation: from its epoch
# `libero-eval status` counts the invocation's elapsed time and its rate, and the report its
# timeline (libero_eval.analysis.timeline).
WORKFLOW = "workflow"
STAMP = "%Y-%m-%d %H:%M:%S"
LAUNCH_LINE = re.compile(r"\[workflow\] workflow launch: .*\(epoch (\d+(?:\.\d+)?)\)")


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


def log_launch(path: Path | str | None, started: float, pid: int, rollout_jobs: int) -> None:
    """The "workflow launch" line an invocation starts with (the Snakefile's ``onstart``):
    when its ``snakemake`` process (``pid``) started, as epoch seconds, and its rollout jobs."""
    log_event(
        path,
        WORKFLOW,
        f"workflow launch: snakemake (pid {pid}) started {time.time() - started:.1f} s before "
        f"its first job (epoch {started:.2f}); {rollout_jobs} rollout job(s) to run",
    )


def last_invocation_start(path: Path | str | None) -> float | None:
    """The epoch of the latest "workflow launch" line in `path`; None without such a line
    (or without the file)."""
    if path is None:
        return None
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    found = LAUNCH_LINE.findall(text)
    return float(found[-1]) if found else None


def episode_line(task_id: int, trial_id: int, success: bool, suite: str, steps: int) -> str:
    """The seed's per-episode milestone."""
    return (
        f"[libero eval] task_id={task_id}, trial_id={trial_id}, success={success}, "
        f"suite={suite}, steps={steps}"
    )
