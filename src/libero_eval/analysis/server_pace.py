"""The server's own pace in a run, from the answers of a slot's requests.

A server computes one batch at a time and answers all of its requests together. So answers
that come within `ANSWER_GAP_S` of each other belong to one server batch, also where the server
merged several one-observation requests (SGLang's dynamic batching). When a batch's requests
had all left before the previous batch was answered, the server held it queued while it
computed, and the time between the two batches' answers is the server's service time for it.
Such back-to-back batches that were full give the seconds per full batch the server took
during the run. This is the figure to set against its capacity probe: the request latency also
holds the wait behind other batches in flight.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

ANSWER_GAP_S = 0.015  # answers closer than this came from one server batch


def server_batches(requests: pd.DataFrame) -> pd.DataFrame:
    """The server batches of a slot's requests (columns `answered_at`, `observations` and
    `left_at`, NaN where unknown, then `sent_at`): one row per batch, in order, with its first
    answer (`answered_at`), its `observations` and when its last request left (`left_at`)."""
    if requests.empty:
        return pd.DataFrame(columns=["answered_at", "observations", "left_at"])
    ordered = requests.sort_values("answered_at")
    answered = ordered["answered_at"].to_numpy(float)
    batch = np.concatenate([[0], np.cumsum(np.diff(answered) >= ANSWER_GAP_S)])
    left = ordered["left_at"].fillna(ordered["sent_at"]).to_numpy(float)
    frame = pd.DataFrame(
        {"batch": batch, "answered_at": answered, "observations": ordered["observations"]}
    ).assign(left_at=left)
    return frame.groupby("batch").agg(
        answered_at=("answered_at", "min"),
        observations=("observations", "sum"),
        left_at=("left_at", "max"),
    )


def full_batch_seconds(requests: pd.DataFrame, full: int) -> float:
    """The median seconds the server took for a full batch (`full` observations) that it had
    queued while it computed the one before; NaN without such a batch."""
    batches = server_batches(requests)
    if len(batches) < 2 or full < 1:
        return math.nan
    answered = batches["answered_at"].to_numpy(float)
    queued = batches["left_at"].to_numpy(float)[1:] <= answered[:-1]
    whole = batches["observations"].to_numpy()[1:] >= full
    service = np.diff(answered)[queued & whole]
    return float(np.median(service)) if len(service) else math.nan
