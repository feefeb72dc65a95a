"""What a shard runs with (`ShardSettings`, composed above the rollout layer by
`libero_eval.config.RunSettings`), and the error that ends a shard (`ShardFailed`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from libero_eval.failures import FailurePolicy
from libero_eval.policy.adapter import PolicyAdapter
from libero_eval.policy.connection import ConnectionSpec
from libero_eval.rollout.libero_env import EnvSettings
from libero_eval.rollout.protocols import EpisodeProtocol


class ShardFailed(RuntimeError):
    """The shard cannot go on (server gone, request rejected); finished episodes are kept."""


@dataclass
class ShardSettings:
    """What a shard runs with; composed above this layer (`libero_eval.config.RunSettings`).

    Its config fields (`rollout.envs_per_shard`, `max_inflight_requests`, `batch_timeout_s`,
    `server.health_timeout_s`) have no default here: the config, filled by the schema, gives
    them (tests/test_settings_defined_once.py checks them against the schema)."""

    run_id: str
    shard: str
    slot: int
    protocol: EpisodeProtocol  # its seed is the run's seed (recorded in every row)
    env: EnvSettings
    adapter: PolicyAdapter  # built once, by whoever composed the job (its statistics loaded)
    envs_per_shard: int  # what the job got (rollout.envs_per_shard, maybe lowered to --cores)
    # rollout.total_num_envs as configured: "auto" lets the shard choose its envs (up to
    # envs_per_shard, rollout.auto), an int or None (envs_per_shard rules) does not
    total_num_envs: int | str | None
    # requests at the server at once (one computing, the rest queued behind it); None: as
    # many as the envs fill, ceil(envs / the server's max batch)
    max_inflight_requests: int | None
    # at a merging server: "batches", "as_ready" (Dispatcher.as_ready) or "auto" (rollout.auto)
    merged_dispatch: str
    batch_timeout_s: float  # a partial batch waits no longer at an idle server
    health_timeout_s: float  # server.health_timeout_s
    # the server's endpoint (channel, wire format, paths); its URL comes from the service file
    endpoint: ConnectionSpec = field(default_factory=lambda: ConnectionSpec(""))
    # what a failure leads to (rollout.failures); None: the schema's defaults
    failures: FailurePolicy | None = None
    event_log: Path | None = None
    video_dir: Path | None = None
    # the server's batch as the config says (its max batch size): packs the first episodes
    # onto tasks before the server answers, whose metadata then rules
    expected_batch: int = 1
    # GPU memory the env workers' renderers may take (MiB; None: they render on the CPU)
    render_gpu_budget_mib: int | None = None
