"""One episode's result row, as the store and the shard's Parquet keep it, and its video."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from libero_eval.plan import Episode
from libero_eval.rollout.libero_env import EpisodeOutcome
from libero_eval.rollout.protocols import reset_seed_of
from libero_eval.rollout.scheduler import RunningEpisode
from libero_eval.rollout.shard_settings import ShardSettings
from libero_eval.suites import base_suite


def episode_record(
    settings: ShardSettings,
    episode: Episode,
    running: RunningEpisode | None,
    url: str | None,
    outcome: EpisodeOutcome | None = None,
    error: str | None = None,
    video_path: str | None = None,
) -> dict[str, Any]:
    """The episode's result row (`running`: its attempt on a worker; None: never started;
    `url`: the server's, None before the shard knew it)."""
    latencies = np.asarray(running.latencies if running else [], dtype=float)
    has_latency = latencies.size > 0
    protocol = settings.protocol.with_seed(episode.seed)  # the episode's run seed (plan.seeds)
    return {
        "run_id": settings.run_id,
        "suite": episode.suite,
        "base_suite": base_suite(episode.suite),
        "task_id": episode.task_id,
        "task_language": running.task_language if running else None,
        "init_state_id": episode.init_state_id,
        "seed": protocol.seed,
        "reset_seeding": settings.env.reset_seeding,
        "episode_seed": reset_seed_of(
            protocol,
            settings.env.reset_seeding,
            episode.suite,
            episode.task_id,
            episode.init_state_id,
        ),
        "protocol": settings.protocol.name,
        "success_once": bool(outcome and outcome.success_once),
        "success_at_end": bool(outcome and outcome.success_at_end),
        "first_success_step": outcome.first_success_step if outcome else None,
        "steps": outcome.steps if outcome else 0,
        "policy_calls": int(latencies.size),
        "policy_latency_mean_s": float(latencies.mean()) if has_latency else None,
        "policy_latency_p50_s": float(np.percentile(latencies, 50)) if has_latency else None,
        "policy_latency_p95_s": float(np.percentile(latencies, 95)) if has_latency else None,
        "wall_time_s": time.perf_counter() - running.started if running else 0.0,
        "server_slot": settings.slot,
        "server_url": url,
        "shard": settings.shard,
        "finished_at": time.time(),
        "video_path": video_path,
        "error": error,
    }


def save_video(frames: list[np.ndarray], video_dir: Path, episode: Episode, success: bool) -> str:
    """Write an episode video under a unique name (never overwritten: suite/task/trial)."""
    import imageio.v3 as iio

    tag = "success" if success else "failure"
    path = (
        video_dir
        / episode.suite
        / f"task{episode.task_id:02d}_init{episode.init_state_id:02d}_{tag}.mp4"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, np.stack(frames), fps=10, codec="libx264")
    return str(path)
