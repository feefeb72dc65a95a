"""π0.5 end to end with real LIBERO: a shard over the websocket to the reference server, whose
state and image checks hold on real observations, and fail loudly for wrong statistics."""

from __future__ import annotations

import json

import pytest
from snakemake.utils import validate
from test_pi05_adapter import STATS
from test_pi05_reference import COSMOS3_STATS

from libero_eval.config import RunSettings
from libero_eval.plan import Episode
from libero_eval.reference.server import serve_in_thread
from libero_eval.reference.settings import ReferenceServerSettings
from libero_eval.rollout.runner import ShardFailed, run_shard
from libero_eval.store import EpisodeStore

pytestmark = pytest.mark.libero
REPO = STATS.parents[2]
EPISODE = Episode("libero_spatial", 0, 0)


def pi05_shard(tmp_path, **pi05):
    config = {
        "run_id": "pi05_libero",
        "policy": {"family": "pi05", "http_max_retries": 0, "pi05": pi05},
        "server": {"reference": {"policy": "scripted"}},
        "rollout": {
            "protocol": "openpi",
            "max_steps": 20,
            "camera_size": 128,
            "envs_per_shard": 1,
            "send_privileged_state": True,
        },
    }
    validate(config, str(REPO / "src" / "libero_eval" / "data" / "schema.yaml"))
    return RunSettings(config).shard_settings("shard000", 0, 1), EpisodeStore(tmp_path / "episodes")


@pytest.fixture(scope="module")
def url():
    settings = ReferenceServerSettings(
        action_stats_path=COSMOS3_STATS, policy="scripted", family="pi05", norm_stats_path=STATS
    )
    with serve_in_thread(settings) as base_url:
        yield base_url


def test_a_pi05_episode_runs_over_the_websocket_with_checked_state_and_images(tmp_path, url):
    settings, store = pi05_shard(tmp_path, api="sglang_websocket", norm_stats_path=str(STATS))
    (record,) = run_shard([EPISODE], settings, store, url, tmp_path / "s.parquet", progress=False)
    assert record["error"] is None
    assert record["protocol"] == "openpi"
    assert record["policy_calls"] == 4  # 20 policy steps, replanning every 5


def test_client_statistics_other_than_the_models_fail_the_shard_loudly(tmp_path, url):
    stats = json.loads(STATS.read_text())
    stats["norm_stats"]["state"]["q01"][2] -= 0.3
    other = tmp_path / "norm_stats.json"
    other.write_text(json.dumps(stats))
    settings, store = pi05_shard(tmp_path, norm_stats_path=str(other))
    with pytest.raises(ShardFailed, match="the state does not match the robot's: channel 2"):
        run_shard([EPISODE], settings, store, url, tmp_path / "s.parquet", progress=False)
    assert store.load(EPISODE) is None  # nothing half-written


@pytest.mark.parametrize(
    ("lineage", "pi05"),
    [("lerobot", {}), ("openpi", {"discrete_state_input": False})],
    ids=["lerobot", "openpi"],
)
def test_each_lineage_runs_against_a_server_standing_in_for_its_checkpoint(tmp_path, lineage, pi05):
    """The self-test's path: the reference server loads the checkpoint's layout and
    statistics, and checks cameras, state width, tokens, state values and images on real
    LIBERO observations."""
    from conftest import pi05_checkpoint

    checkpoint = pi05_checkpoint(lineage)
    server = ReferenceServerSettings(
        action_stats_path=COSMOS3_STATS,
        policy="scripted",
        family="pi05",
        norm_stats_path=checkpoint,
    )
    settings, store = pi05_shard(tmp_path, checkpoint=str(checkpoint), **pi05)
    with serve_in_thread(server) as base_url:
        (record,) = run_shard(
            [EPISODE], settings, store, base_url, tmp_path / "s.parquet", progress=False
        )
    assert record["error"] is None
    assert record["policy_calls"] == 4  # 20 policy steps, replanning every 5
