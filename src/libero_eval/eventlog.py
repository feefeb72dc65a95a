"""`logs/<run>/eval_embodiment.log`: the evaluation's milestones, one line each, in order.

Every stage appends to the same file (O_APPEND, one write per line), so the file reads in
time order: server launch, server ready, rollout assignments (`rank -> url`), one
`[libero eval] task_id=.., trial_id=.., success=..` line per episode, then the summary.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def log_event(path: Path | str | None, source: str, message: str) -> None:
    """Append one timestamped milestone line (multi-line messages are indented)."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    text = f"{stamp} [{source}] {message.rstrip()}".replace("\n", "\n    ") + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def episode_line(task_id: int, trial_id: int, success: bool, suite: str, steps: int) -> str:
    """The seed's per-episode milestone."""
    return (
        f"[libero eval] task_id={task_id}, trial_id={trial_id}, success={success}, "
        f"suite={suite}, steps={steps}"
    )
