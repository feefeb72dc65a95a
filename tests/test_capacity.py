"""A server's own capacity, measured at its start (`libero_eval.policy.capacity`): against the
real reference server with its latency model on (the measured seconds are never below the
model's; no upper bounds on time), and through a serve job's whole life into its service file."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from libero_eval import package_data
from libero_eval.config import RunSettings
from libero_eval.policy.capacity import (
    CLOSED_LOOP_BATCHES,
    CLOSED_LOOP_ROUNDS,
    CapacityProbe,
    closed_loop_seconds_per_batch,
    measure_capacity,
    synthetic_observation,
    warm_graphs,
)
from libero_eval.policy.families.pi05.run_config import pi05_graph_batches
from libero_eval.reference.server import serve_in_thread
from libero_eval.reference.settings import ReferenceServerSettings
from libero_eval.service import capacity_of, read_service_file

COSMOS3_STATS = package_data.path("stats/libero_native_frame_wise_relative_rot6d.json")
PI05_STATS = package_data.path("stats/pi05_libero_norm_stats.json")
FIXED, PER_ITEM = 0.05, 0.02


def latency(n: int) -> float:
    return FIXED + PER_ITEM * n


def run_settings(config: dict, family: str = "cosmos3", max_batch: int = 4) -> RunSettings:
    config = copy.deepcopy(config)
    config["policy"]["family"] = family
    if family == "pi05":  # no checkpoint: the made-up test statistics, named explicitly
        config["policy"]["pi05"]["norm_stats_path"] = str(PI05_STATS)
    config["server"]["reference"].update(
        max_batch_size=max_batch, latency_fixed_s=FIXED, latency_per_item_s=PER_ITEM
    )
    return RunSettings(config)


def check_entry(capacity: dict[str, Any], max_batch: int, requests_at_max: int) -> None:
    assert capacity["max_batch_size"] == max_batch
    one, full = capacity["probes"]
    assert (one["observations"], one["requests"]) == (1, 1)
    assert (full["observations"], full["requests"]) == (max_batch, requests_at_max)
    assert one["seconds"] >= latency(1) and full["seconds"] >= latency(max_batch)
    best = max(p["observations"] / p["seconds"] for p in capacity["probes"])
    assert capacity["obs_per_s"] == pytest.approx(best, abs=0.01)


def test_the_probe_measures_a_cosmos3_servers_batch_1_and_its_largest_batch(default_config):
    run = run_settings(default_config)
    server = ReferenceServerSettings(
        family_settings={"action_stats_path": COSMOS3_STATS},
        policy="scripted",  # needs privileged state: the probe sends a scene with nothing to do
        max_batch_size=4,
        latency_fixed_s=FIXED,
        latency_per_item_s=PER_ITEM,
    )
    assert run.capacity_probe.privileged_state and run.capacity_probe.merged_batch_size == 4
    with serve_in_thread(server) as url:
        check_entry(run.capacity_probe(url), max_batch=4, requests_at_max=1)


def test_the_probe_sends_one_observation_requests_at_once_to_a_pi05_server(default_config):
    run = run_settings(default_config, family="pi05", max_batch=3)
    probe = dataclasses.replace(run.capacity_probe, privileged_state=False)
    server = ReferenceServerSettings(
        policy="hold",
        family="pi05",
        family_settings={"norm_stats_path": PI05_STATS},
        max_batch_size=3,
        latency_fixed_s=FIXED,
        latency_per_item_s=PER_ITEM,
    )
    with serve_in_thread(server) as url:
        check_entry(probe(url), max_batch=3, requests_at_max=3)


class FakeConnection:
    def __init__(self, log: list[str], per_request: int) -> None:
        self.log, self.per_request = log, per_request

    def max_batch_size(self) -> int:
        return self.per_request

    def infer(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.log.append(payload["request_id"])
        return payload

    def close(self) -> None:
        self.log.append("close")


class EchoAdapter:
    def build_request(self, observations, request_id):
        return {"request_id": request_id, "n": len(observations)}

    def parse_response(self, response, batch_size):
        assert response["n"] == batch_size


def test_one_warmup_then_two_timed_calls_at_each_size_and_the_mean_is_kept():
    log: list[str] = []
    # each call reads the clock before and after: warm-up, then two timed calls, per size
    ticks = iter([0.0, 0.5, 0.0, 1.0, 1.0, 2.0, 5.0, 6.0, 10.0, 12.0, 12.0, 16.0])
    capacity = measure_capacity(
        lambda: FakeConnection(log, per_request=8),
        EchoAdapter(),
        synthetic_observation(16),
        clock=lambda: next(ticks),
    )
    assert capacity == {
        "max_batch_size": 8,
        "probes": [
            {"observations": 1, "requests": 1, "seconds": 1.0},
            {"observations": 8, "requests": 1, "seconds": 3.0},
        ],
        "obs_per_s": 2.67,
    }
    assert log == [
        *("capacity-b1-warmup0", "capacity-b1-0", "capacity-b1-1"),
        *("capacity-b8-warmup0", "capacity-b8-0", "capacity-b8-1", "close"),
    ]


def serve_command(tmp_path: Path, probe: dict[str, Any]) -> list[str]:
    settings = {
        "backend": "reference",
        "slot": 0,
        "reference": {
            "policy": "hold",
            "family_settings": {"action_stats_path": str(COSMOS3_STATS)},
            "max_batch_size": 4,
            "latency_fixed_s": FIXED,
            "latency_per_item_s": PER_ITEM,
        },
    }
    return [
        sys.executable,
        *("-m", "libero_eval.serve.job", "--settings", json.dumps(settings)),
        *("--capacity-probe", json.dumps(probe)),
        *("--service-file", str(tmp_path / "slot0.json")),
        *("--event-log", str(tmp_path / "eval_embodiment.log")),
    ]


def serve_until_ready_then_stop(tmp_path: Path, probe: dict[str, Any]) -> dict[str, Any]:
    """Run a serve job's whole life; its service file's content once ready."""
    service_file = tmp_path / "slot0.json"
    with open(tmp_path / "serve.log", "wb") as log:
        job = subprocess.Popen(serve_command(tmp_path, probe), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while (info := read_service_file(service_file)) is None or info["status"] != "ready":
            assert job.poll() is None and time.monotonic() < deadline, (
                tmp_path / "serve.log"
            ).read_text()
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=30) == 0
    finally:
        job.kill()
        job.wait()
    return info


def test_the_serve_job_keeps_the_capacity_in_the_service_file_to_the_end(tmp_path, default_config):
    probe = dataclasses.replace(run_settings(default_config).capacity_probe, privileged_state=False)
    ready = serve_until_ready_then_stop(tmp_path, probe.to_dict())
    check_entry(ready["capacity"], max_batch=4, requests_at_max=1)
    stopped = json.loads((tmp_path / "slot0.json").read_text())
    assert stopped["status"] == "stopped"
    assert capacity_of(tmp_path / "slot0.json") == ready["capacity"]
    lines = (tmp_path / "eval_embodiment.log").read_text().splitlines()
    line = next(x for x in lines if "capacity:" in x)
    assert re.search(
        r"\[serve slot=0\] capacity: batch 1 in \d+\.\d\d s, batch 4 in \d+\.\d\d s: "
        r"\d+\.\d\d obs/s$",
        line,
    )
    assert lines.index(line) < next(i for i, x in enumerate(lines) if "server ready" in x)
    # the start's steps in order, and the probe's part of it (docs/reporting.md)
    steps = ready["timeline"]
    assert steps["launch"] <= steps["healthy"] <= steps["probe_done"] <= steps["ready"]
    assert stopped["timeline"] == steps
    assert set(ready["startup_parts"]) == {"probe"}  # the reference server logs no parts
    assert ready["startup_parts"]["probe"] <= steps["probe_done"] - steps["healthy"] + 0.05
    start = next(x for x in lines if "server start:" in x)
    assert re.search(
        r"server start: \d+\.\d s to ready "
        r"\(\d+\.\d s to healthy\): capacity probe",
        start,
    )
    assert lines.index(line) < lines.index(start)


def test_a_failing_probe_leaves_the_capacity_out_and_the_server_serves(tmp_path, default_config):
    probe = run_settings(default_config).capacity_probe.to_dict()
    probe["policy"] = {**probe["policy"], "action_stats_path": str(tmp_path / "missing.json")}
    ready = serve_until_ready_then_stop(tmp_path, probe)
    assert "capacity" not in ready and capacity_of(tmp_path / "slot0.json") is None
    log = (tmp_path / "eval_embodiment.log").read_text()
    assert "warning: capacity probe failed" in log and "server stopped" in log


def test_a_malformed_probe_is_refused_like_bad_settings(tmp_path):
    job = subprocess.run(serve_command(tmp_path, {"family": "cosmos3"}), capture_output=True)
    assert job.returncode == 2 and b"--capacity-probe" in job.stderr


def test_the_probe_crosses_to_the_serve_job_as_json_unchanged(default_config):
    probe = RunSettings(default_config).capacity_probe
    assert CapacityProbe.from_dict(json.loads(json.dumps(probe.to_dict()))) == probe


def test_a_merging_servers_closed_loop_is_timed_from_each_requesters_first_answer():
    # 4 requesters, batches of 2, 0.5 s a batch: the first round came back split (requester 0
    # alone at the idle server), then each requester's answers 1 s apart (two batches a cycle)
    answered = [[0.5, 1.5, 2.5], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.5, 2.5, 3.5]]
    assert closed_loop_seconds_per_batch(answered, 2) == pytest.approx(0.5)
    # a slower requester (its cycles 2 s) lowers the rate: 3 x 1 + 0.5 observations a second
    answered[3] = [1.5, 3.5, 5.5]
    assert closed_loop_seconds_per_batch(answered, 2) == pytest.approx(2 / 3.5)
    with pytest.raises(ValueError, match="requester 1 got answers at \\[2.0, 2.0\\]"):
        closed_loop_seconds_per_batch([[1.0, 2.0], [2.0, 2.0]], 2)


def test_a_merging_server_is_probed_by_a_closed_loop_of_two_batches_of_requesters():
    log: list[str] = []
    lock = threading.Lock()
    ticks = itertools.count()

    def clock() -> float:
        with lock:
            return float(next(ticks))

    capacity = measure_capacity(
        lambda: FakeConnection(log, per_request=1),
        EchoAdapter(),
        synthetic_observation(16),
        merged_batch_size=3,
        clock=clock,
    )
    requesters = CLOSED_LOOP_BATCHES * 3
    assert [p["requests"] for p in capacity["probes"]] == [1, 3]
    merged = [x for x in log if x.startswith("capacity-b3-")]
    for run in ("warmup0", "0", "1"):  # one warm-up run, then two timed, each a closed loop
        for requester in range(requesters):
            sent = [x for x in merged if x.startswith(f"capacity-b3-{run}-{requester}-")]
            # each requester sends its rounds one after another, on its own connection
            assert sent == [f"capacity-b3-{run}-{requester}-{r}" for r in range(CLOSED_LOOP_ROUNDS)]
    assert len(merged) == 3 * requesters * CLOSED_LOOP_ROUNDS
    assert log.count("close") == requesters  # the batch-1 connection is one of them


def test_the_graph_warmup_sends_each_size_behind_a_lone_request_largest_first():
    log: list[str] = []
    warmed = warm_graphs(
        lambda: FakeConnection(log, per_request=1),
        EchoAdapter(),
        synthetic_observation(16),
        batches=[2, 1, 3],
        lead_s=0.0,
    )
    sent = [x for x in log if x != "close"]
    for size in (3, 2, 1):  # one request the server starts alone, then `size` together
        ours = [x for x in sent if x.startswith(f"graphs-r0-b{size}")]
        assert sorted(ours) == sorted(
            [f"graphs-r0-b{size}-lead-0", *(f"graphs-r0-b{size}-{i}" for i in range(1, size + 1))]
        )
    # the sizes go largest first: a size's requests all come back before the next size leaves
    firsts = [next(i for i, x in enumerate(sent) if f"-b{size}" in x) for size in (3, 2, 1)]
    assert firsts == sorted(firsts)
    assert log.count("close") == 4  # one connection per request of the largest size, + 1
    assert (warmed["batches"], warmed["sent"], warmed["captured"]) == ([1, 2, 3], 9, None)


def test_a_size_the_server_split_is_sent_again_while_its_log_misses_it():
    log: list[str] = []
    # the serve log after each round: the first round's 3 came back as a batch of 2 and 1
    logged = iter([[1, 2], [1, 2, 3], [1, 2, 3]])
    warmed = warm_graphs(
        lambda: FakeConnection(log, per_request=1),
        EchoAdapter(),
        synthetic_observation(16),
        batches=[1, 2, 3],
        captured=lambda: next(logged),
        lead_s=0.0,
    )
    rounds = {x.split("-")[1] for x in log if x.startswith("graphs-")}
    assert rounds == {"r0", "r1"}
    assert {x.split("-")[2] for x in log if x.startswith("graphs-r1-")} == {"b3"}
    assert (warmed["sent"], warmed["captured"]) == (9 + 4, [1, 2, 3])


def test_after_a_graph_warmup_the_probe_makes_no_untimed_calls(default_config):
    run = run_settings(default_config, family="pi05", max_batch=2)
    probe = dataclasses.replace(run.capacity_probe, privileged_state=False, graph_batches=(1, 2))
    server = ReferenceServerSettings(
        policy="hold",
        family="pi05",
        family_settings={"norm_stats_path": PI05_STATS},
        max_batch_size=2,
        latency_fixed_s=FIXED,
        latency_per_item_s=PER_ITEM,
    )
    with serve_in_thread(server) as url:
        entry = probe(url, captured=lambda: [1, 2])
    assert entry["graph_warmup"]["batches"] == [1, 2] and entry["graph_warmup"]["sent"] == 5
    check_entry(entry, max_batch=2, requests_at_max=2)


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ({}, tuple(range(1, 17))),  # the shipped π0.5 config: buckets, 32 graphs kept
        ({"capture_graphs_before_ready": False}, ()),  # the schema's default
        ({"sglang": {"pipeline_config": {}}}, ()),  # exact prompt lengths: per length
        ({"sglang": {"pipeline_config": {"prompt_token_buckets": [200]}}}, ()),  # 4 kept < 16
        ({"sglang": {"batching_max_size": 4}}, (1, 2, 3, 4)),
        ({"backend": "reference"}, ()),  # no CUDA graphs
    ],
)
def test_the_probe_warms_graphs_only_where_sglang_keys_them_by_batch_size(server, expected):
    config = yaml.safe_load(Path("config/libero_pi05_openpi_sglang.yaml").read_text())
    sglang = {**config["server"]["sglang"], **server.get("sglang", {})}
    if "pipeline_config" in server.get("sglang", {}):
        sglang["pipeline_config"] = server["sglang"]["pipeline_config"]
    config["server"] = {
        **config["server"],
        "backend": server.get("backend", "sglang"),
        "capture_graphs_before_ready": server.get("capture_graphs_before_ready", True),
    }
    config["server"]["sglang"] = sglang
    assert pi05_graph_batches(config) == expected
