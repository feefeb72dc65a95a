"""A run's pace over time, from its episode rows: when its first episode started, and the env
steps per second in each time bin (each episode's steps spread evenly over the time it ran)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def run_start(episodes: pd.DataFrame) -> float:
    """The epoch at which the run's first episode started."""
    return float((episodes["finished_at"] - episodes["wall_time_s"]).min())


def steps_per_second(episodes: pd.DataFrame, edges: np.ndarray, origin: float) -> np.ndarray:
    """Env steps per second in each time bin (edges in seconds after `origin`), each episode's
    steps spread evenly over the interval it ran."""
    finish = (episodes["finished_at"] - origin).to_numpy(float)
    begin = finish - episodes["wall_time_s"].to_numpy(float)
    rate = episodes["steps"].to_numpy(float) / np.maximum(finish - begin, 1e-9)
    overlap = np.clip(
        np.minimum(finish[:, None], edges[None, 1:]) - np.maximum(begin[:, None], edges[None, :-1]),
        0,
        None,
    )
    return (rate[:, None] * overlap).sum(axis=0) / np.diff(edges)
