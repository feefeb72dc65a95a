"""Where an env's time per query went, from the shards' dispatch logs (their ``env_work``:
`libero_eval.rollout.dispatch_log.ENV_WORK`).

A query's time is what the shard saw: from sending an env its action chunk to receiving the
env's next observation. Its worker says what the chunk took inside it, and how much of that its
cameras spent rendering, so a query's seconds split into

- **simulating**: the worker's wall time less its renders (MuJoCo's physics, the controller,
  building the observation);
- **rendering**: its cameras' renders; on a GPU that also runs the policy server a render
  waits for the server's work, so this part grows when the server is busy;
- **hand-off**: the rest, in the pipes and the shard's own loop (which also builds and sends
  the policy requests).

The figures are means over the queries received in the middle `MID` of the slot's serving
window (first request to last answer; all of its queries where none falls inside), where every
env is busy. The worker's CPU seconds say how much of its time it computed. The renders of the
episodes' first observations received before the server was ready are the baseline: the
same renders with no policy server at work on the GPU yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from libero_eval.rollout.dispatch_log import ENV_WORK

MID = 0.8  # the mid-run window: this middle part of the serving window (benchmarks' too)
COLUMNS = (
    "env_query_s",  # mean seconds a query, as the shard saw it
    "env_sim_s",  # of which simulating (the worker's wall time less its renders)
    "env_render_s",  # of which rendering
    "env_handoff_s",  # of which the pipes and the shard's loop
    "env_cpu_s",  # the worker's CPU seconds a query
    "env_start_render_s",  # a first observation's renders, before the server was ready
)


def env_work_frame(logs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The shards' ``env_work`` entries as one frame (`ENV_WORK` columns, plus each entry's
    shard's ``service_ready`` time); empty for logs written before it was recorded."""
    rows = [
        [*entry, (log.get("timeline") or {}).get("service_ready")]
        for log in logs
        for entry in log.get("env_work", ())
    ]
    frame = pd.DataFrame(rows, columns=[*ENV_WORK, "service_ready"])
    numeric = [c for c in frame.columns if c != "command"]
    return frame.astype(dict.fromkeys(numeric, float))


def env_time(
    logs: Sequence[Mapping[str, Any]], first_request: float, last_answer: float
) -> dict[str, float]:
    """The slot's `COLUMNS` from its shards' logs and its serving window (wall-clock epochs);
    NaN where nothing was recorded (rendering: where the envs render every step)."""
    figures = dict.fromkeys(COLUMNS, math.nan)
    work = env_work_frame(logs)
    if work.empty:
        return figures
    chunks = work[work["command"] == "chunk"]
    margin = (last_answer - first_request) * (1 - MID) / 2
    inside = chunks["received_at"].between(first_request + margin, last_answer - margin)
    if inside.any():
        chunks = chunks[inside]
    if not chunks.empty:
        render = chunks["render_s"]  # NaN where the envs render every step
        figures |= {
            "env_query_s": float(chunks["shard_s"].mean()),
            "env_sim_s": float((chunks["wall_s"] - render.fillna(0.0)).mean()),
            "env_render_s": float(render.mean()) if render.notna().all() else math.nan,
            "env_handoff_s": float((chunks["shard_s"] - chunks["wall_s"]).mean()),
            "env_cpu_s": float(chunks["cpu_s"].mean()),
        }
    starts = work[(work["command"] == "start") & (work["received_at"] < work["service_ready"])]
    if not starts.empty:
        figures["env_start_render_s"] = float(starts["render_s"].mean())
    return figures


def env_time_text(figures: Mapping[str, float]) -> str:
    """The split in words ("0.25 s: 0.13 simulating, 0.10 rendering (0.01 before the server
    was ready), 0.02 hand-off; 0.12 s of CPU"), or "" where the queries were not recorded."""
    if math.isnan(figures.get("env_query_s", math.nan)):
        return ""
    parts = [f"{figures['env_sim_s']:.2f} simulating"]
    if math.isnan(figures["env_render_s"]):
        parts[0] = f"{figures['env_sim_s']:.2f} simulating and rendering (every step)"
    else:
        before = figures["env_start_render_s"]
        baseline = "" if math.isnan(before) else f" ({before:.3f} before the server was ready)"
        parts.append(f"{figures['env_render_s']:.3f} rendering{baseline}")
    parts.append(f"{figures['env_handoff_s']:.2f} hand-off")
    return (
        f"{figures['env_query_s']:.2f} s: {', '.join(parts)}; {figures['env_cpu_s']:.2f} s of CPU"
    )
