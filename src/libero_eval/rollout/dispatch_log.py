"""A shard's dispatch log (`results/<run>/shards/<shard>.dispatch.json`), read by
`libero_eval.efficiency`.

Placeholder until the runner's dispatch rewrite records every policy request: this writes the
log's format with empty `requests` and zero env seconds, so the workflow's output exists.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Protocol


class ShardFacts(Protocol):
    """What the log takes of a shard's settings (`rollout.runner.ShardSettings`)."""

    shard: str
    slot: int
    envs_per_shard: int
    max_inflight_requests: int


def write_placeholder(
    path: Path | str,
    settings: ShardFacts,
    server_url: str,
    max_batch_size: int,
    started_at: float,
    counts: dict[str, int],
) -> None:
    """The shard's dispatch log without requests (`counts`: reused_episodes, episodes_run)."""
    log = {
        "shard": settings.shard,
        "slot": settings.slot,
        "server_url": server_url,
        "envs": settings.envs_per_shard,
        "max_batch_size": max_batch_size,
        "max_inflight_requests": settings.max_inflight_requests,
        "started_at": started_at,
        "ended_at": time.time(),
        "requests": [],
        "env_seconds": {"waiting": 0.0, "stepping": 0.0},
        **counts,
    }
    Path(path).write_text(json.dumps(log) + "\n")
