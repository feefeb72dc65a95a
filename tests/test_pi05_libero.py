"""π0.5 end to end with real LIBERO: a shard over the websocket to the reference server, whose
state and image checks hold on real observations, and fail loudly for wrong statistics."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http import HTTPStatus
from pathlib import Path

import pytest
from test_pi05_adapter import STATS
from websockets.sync.client import connect as ws_connect
from websockets.sync.server import ServerConnection, serve

from libero_eval.config import RunSettings, validate_config
from libero_eval.plan import Episode
from libero_eval.reference.server import serve_in_thread
from libero_eval.reference.settings import ReferenceServerSettings
from libero_eval.rollout.shard_run import run_shard
from libero_eval.rollout.shard_settings import ShardFailed
from libero_eval.store import EpisodeStore

pytestmark = pytest.mark.libero
REPO = Path(__file__).resolve().parents[1]
EPISODE = Episode("libero_spatial", 0, 0)


def pi05_shard(tmp_path, **pi05):
    config = {
        "run_id": "pi05_libero",
        "policy": {"family": "pi05", "pi05": pi05},
        "server": {"reference": {"policy": "scripted"}},
        "rollout": {
            "protocol": "openpi",
            "max_steps": 20,
            "camera_size": 128,
            "envs_per_shard": 1,
            "send_privileged_state": True,
            "failures": {"request_retries": 0},
        },
    }
    validate_config(config)
    return RunSettings(config).shard_settings("shard000", 0, 1), EpisodeStore(tmp_path / "episodes")


@pytest.fixture(scope="module")
def url():
    settings = ReferenceServerSettings(
        policy="scripted", family="pi05", family_settings={"norm_stats_path": STATS}
    )
    with serve_in_thread(settings) as base_url:
        yield base_url


def test_a_pi05_episode_runs_over_the_websocket_with_checked_state_and_images(tmp_path, url):
    settings, store = pi05_shard(tmp_path, api="sglang_websocket", norm_stats_path=str(STATS))
    (record,) = run_shard([EPISODE], settings, store, url, tmp_path / "s.parquet", progress=False)
    assert record["error"] is None
    assert record["protocol"] == "openpi"
    assert record["policy_calls"] == 4  # 20 policy steps, replanning every 5


@contextmanager
def crashing_once_in_front_of(upstream: str) -> Iterator[str]:
    """A websocket server in front of the reference server's ``/openpi/policy`` whose first
    request is answered by a close with code 1011 (internal error), as a server that fails
    inside does; every other frame goes to the reference server and back."""
    crashed: list[bool] = []

    def health(connection: ServerConnection, request):
        if request.path == "/health":
            return connection.respond(HTTPStatus.OK, "ok\n")
        return None

    def handler(ws: ServerConnection) -> None:
        with ws_connect(upstream.replace("http", "ws") + "/openpi/policy") as up:
            ws.send(up.recv())  # the server's metadata
            for frame in ws:
                if not crashed:
                    crashed.append(True)
                    ws.close(code=1011, reason="Internal server error")
                    return
                up.send(frame)
                ws.send(up.recv())

    server = serve(handler, "127.0.0.1", 0, process_request=health, compression=None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    finally:
        server.shutdown()
        thread.join(timeout=5)
    assert crashed  # the close happened


def test_a_websocket_close_with_1011_is_retried_and_the_episode_completes(tmp_path, url):
    """A transient server failure on the websocket (close 1011, no error frame) is retried
    like an HTTP 5xx (rollout.failures), not a rejected request that fails the shard."""
    settings, store = pi05_shard(tmp_path, api="sglang_websocket", norm_stats_path=str(STATS))
    settings.failures = replace(settings.failures, request_retries=1, retry_backoff_s=0.0)
    with crashing_once_in_front_of(url) as proxy:
        (record,) = run_shard(
            [EPISODE], settings, store, proxy, tmp_path / "s.parquet", progress=False
        )
    assert record["error"] is None
    assert record["policy_calls"] == 4  # the retried request is one call


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
        policy="scripted", family="pi05", family_settings={"norm_stats_path": checkpoint}
    )
    settings, store = pi05_shard(tmp_path, checkpoint=str(checkpoint), **pi05)
    with serve_in_thread(server) as base_url:
        (record,) = run_shard(
            [EPISODE], settings, store, base_url, tmp_path / "s.parquet", progress=False
        )
    assert record["error"] is None
    assert record["policy_calls"] == 4  # 20 policy steps, replanning every 5


def test_a_server_that_merges_requests_gets_a_batch_of_them_at_once_and_no_outcome_changes(
    tmp_path,
):
    """SGLang merges π0.5's one-observation requests that reach it together: with the
    server's merge size known (its capacity probe), the shard sends a batch's requests at
    once. The dispatch changes timing only: the episodes' outcomes are those of a shard that
    sends every observation on its own, to a server that does not merge, and of a shard that
    chooses its envs and dispatch itself (auto)."""
    episodes = [Episode("libero_spatial", 0, 0), Episode("libero_spatial", 0, 1)]
    # a server slower than the envs (3 s a batch), so that a batch waits for both envs
    merging = {"max_batch_size": 2, "latency_fixed_s": 3.0, "latency_per_item_s": 0.0}
    # the probe's model says 30 s a batch: an idle server's hold (its fixed cost) then waits
    # for the sibling env, however slow a loaded machine makes its reset, not a short deadline
    probes = [
        {"observations": 1, "requests": 1, "seconds": 30.0},
        {"observations": 2, "requests": 2, "seconds": 30.0},
    ]
    capacity = {"max_batch_size": 2, "probes": probes, "obs_per_s": 0.067}
    outcomes, logs, built_on = [], [], {}
    runs = (
        ("alone", None, {}),
        ("merged", capacity, merging),
        ("as_ready", capacity, merging),
        ("auto", capacity, merging),  # envs and dispatch left to the shard
    )
    for name, server_capacity, model in runs:
        server = ReferenceServerSettings(
            policy="scripted",
            family="pi05",
            family_settings={"norm_stats_path": STATS},
            **model,
        )
        settings, store = pi05_shard(tmp_path / name, norm_stats_path=str(STATS))
        settings.envs_per_shard = 2
        settings.batch_timeout_s = 60.0  # the idle server's hold is then its fixed cost
        settings.merged_dispatch = name if name in ("as_ready", "auto") else "batches"
        settings.total_num_envs = "auto" if name == "auto" else None
        build, built_on[name] = settings.adapter.build_request, []

        def recorded(observations, request_id, build=build, threads=built_on[name]):
            threads.append(threading.current_thread().name)
            return build(observations, request_id)

        settings.adapter.build_request = recorded
        with serve_in_thread(server) as base_url:
            records = run_shard(
                episodes,
                settings,
                store,
                base_url,
                tmp_path / name / "s.parquet",
                progress=False,
                dispatch_log=tmp_path / name / "dispatch.json",
                capacity=server_capacity,
            )
        outcomes.append([(r["success_once"], r["steps"], r["first_success_step"]) for r in records])
        logs.append(json.loads((tmp_path / name / "dispatch.json").read_text()))
    # rollout.merged_dispatch and total_num_envs (auto included): timing only
    assert outcomes[0] == outcomes[1] == outcomes[2] == outcomes[3]
    alone, merged, _, chosen = logs
    assert chosen["envs_choice"]["setting"] == "auto"
    assert chosen["dispatch_choice"]["setting"] == "auto"
    assert alone["server_batch"] == 1 and merged["server_batch"] == 2
    assert {request[2] for request in merged["requests"]} == {1}  # one observation each
    sent = [request[0] for request in merged["requests"]]
    assert len(sent) == 8 and len(set(sent)) == 4  # both envs' requests left together
    # a merged request is built as its observation comes (the shard's loop), so that a
    # batch's requests leave together; a request of its own is built by its policy thread
    assert set(built_on["merged"]) == {"MainThread"} and len(built_on["merged"]) == 8
    assert all(name.startswith("policy-") for name in built_on["alone"])
