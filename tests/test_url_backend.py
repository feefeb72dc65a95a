"""`server.backend: url`: servers the user already runs. The serve job checks them (readiness,
family, model), probes them and announces them, and never starts or stops them; the config
names them once per slot and the fingerprint by `server.url.model_id` (else their URLs).

Real HTTP throughout: the reference server as a process of its own (as a user runs a server),
a tiny `http.server` where a server's answers must be scripted, and one real Snakemake run with
LIBERO."""

import contextlib
import copy
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import requests
import yaml
from conftest import workflow_dir

from libero_eval.config import ConfigError, check_config, validate_config
from libero_eval.config_server import gpus_per_slot, slot_gpu_ids, slot_urls, url_backend_warnings
from libero_eval.serve.events import EventLog, StopRequest
from libero_eval.serve.settings import ServerSettings
from libero_eval.serve.url_server import UrlServerError, UrlSlot, via_proxy
from libero_eval.service import capacity_of, read_service_file

REPO = Path(__file__).resolve().parents[1]
COSMOS3_STATS = "libero_eval:stats/libero_native_frame_wise_relative_rot6d.json"
PI05_STATS = "libero_eval:stats/pi05_libero_norm_stats.json"
READY_WAIT_S = 120  # a ceiling for the events below on a loaded machine, never a measurement


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, what: str, process: subprocess.Popen | None = None) -> None:
    """Poll ``condition()`` until true (an event, not a deadline race: the ceiling only ends
    a test that would otherwise hang)."""
    deadline = threading.Event()
    timer = threading.Timer(READY_WAIT_S, deadline.set)
    timer.start()
    try:
        while not condition():
            assert process is None or process.poll() is None, f"{what}: the process exited"
            assert not deadline.is_set(), f"{what}: not within {READY_WAIT_S} s"
            deadline.wait(0.05)
    finally:
        timer.cancel()


def answers_health(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False


@contextlib.contextmanager
def user_server(tmp_path: Path, family: str = "cosmos3") -> Iterator[tuple[str, subprocess.Popen]]:
    """The reference server run as a user runs a server: its own process, its own port."""
    port = free_port()
    family_settings = {"action_stats_path": COSMOS3_STATS}
    if family == "pi05":
        family_settings = {"norm_stats_path": PI05_STATS}
    args = ["--port", str(port), "--policy", "hold", "--family", family]
    args += ["--family-settings", json.dumps(family_settings)]
    log = (tmp_path / f"user_server_{port}.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "libero_eval.reference.server", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers_health(url), "the user's server", process)
        yield url, process
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()


def url_config(urls: Any, **url_fields: Any) -> dict[str, Any]:
    config = {
        "run_id": "url",
        "plan": {"task_ids": [0], "num_trials_per_task": 1},
        "server": {"backend": "url", "url": {"urls": urls, **url_fields}},
        "rollout": {"send_privileged_state": False},
    }
    return config


def checked(config: dict[str, Any]):
    config = copy.deepcopy(config)
    validate_config(config)
    return check_config(config)


def serve_job(tmp_path: Path, config: dict[str, Any], **settings: Any) -> subprocess.Popen:
    """The serve rule's process for slot 0 of ``config`` (output to serve.log)."""
    run = checked(config)
    data = {**run.server(0).to_dict(), **settings}
    log = (tmp_path / "serve.log").open("w")
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "libero_eval.serve.job", "--settings", json.dumps(data)),
            *("--capacity-probe", json.dumps(run.capacity_probe.to_dict())),
            *("--service-file", str(tmp_path / "slot0.json")),
            *("--event-log", str(tmp_path / "eval_embodiment.log")),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def service(tmp_path: Path) -> dict[str, Any] | None:
    return read_service_file(tmp_path / "slot0.json")


def failed_job(tmp_path: Path, config: dict[str, Any], **settings: Any) -> str:
    """A serve job that fails: its exit code 1, the error its service file publishes."""
    job = serve_job(tmp_path, config, **settings)
    assert job.wait(timeout=READY_WAIT_S) == 1, (tmp_path / "serve.log").read_text()
    info = service(tmp_path)
    assert info is not None and info["status"] == "failed"
    assert info["error"] in (tmp_path / "serve.log").read_text()
    assert info["error"] in (tmp_path / "eval_embodiment.log").read_text()
    return info["error"]


# --- the serve job -----------------------------------------------------------------------------


def test_a_user_server_is_checked_probed_announced_and_left_running(tmp_path):
    with user_server(tmp_path) as (url, server):
        config = url_config([url + "/"], model_id="reference-hold")
        job = serve_job(tmp_path, config)
        try:
            wait_until(lambda: (service(tmp_path) or {}).get("status") == "ready", "ready", job)
            ready = service(tmp_path)
            job.send_signal(signal.SIGTERM)
            assert job.wait(timeout=READY_WAIT_S) == 0
        finally:
            job.kill()
        # announced like a launched server, with what it said of itself
        assert ready["url"] == url and ready["source"] == "server.url.urls[0]"
        assert ready["backend"] == "url" and ready["health_path"] == "/health"
        assert ready["served_model"] == {
            "policy_family": "cosmos3",
            "model": "reference-hold",
            "model_path": "reference://hold",
        }
        assert [p["observations"] for p in ready["capacity"]["probes"]] == [1, 8]
        # no cold start: its start is the readiness check and the probe
        steps = ready["timeline"]
        assert steps["launch"] <= steps["healthy"] <= steps["probe_done"] <= steps["ready"]
        assert set(ready["startup_parts"]) == {"health", "probe"}
        # teardown left the server running, and it still serves
        stopped = service(tmp_path)
        assert stopped["status"] == "stopped" and stopped["left_running"] is True
        assert capacity_of(tmp_path / "slot0.json") == ready["capacity"]
        assert server.poll() is None and answers_health(url)
        assert checked(config).capacity_probe(url)["obs_per_s"] > 0
        log = (tmp_path / "eval_embodiment.log").read_text()
        for line in (
            f"server url: {url} (server.url.urls[0]: a server you run",
            f"server checked: {url} serves cosmos3 (model 'reference-hold'",
            "to healthy; no cold start, a server you run): until /health",
            f"server ready: {url}",
            f"server left running: {url} (received SIGTERM; server.backend url",
        ):
            assert line in log, log


def test_a_server_of_another_family_is_refused_naming_the_url(tmp_path):
    with user_server(tmp_path, family="cosmos3") as (url, _):
        config = url_config([url])
        config["policy"] = {"family": "pi05", "pi05": {"norm_stats_path": PI05_STATS}}
        error = failed_job(tmp_path, config)
    assert error.startswith(f"server.url.urls[0] {url}: refused: ")
    assert "serves family 'cosmos3' but policy.family is 'pi05'" in error


def test_a_server_of_another_model_is_refused_saying_what_it_serves(tmp_path):
    with user_server(tmp_path, family="pi05") as (url, _):
        config = url_config([url], model_id="pi05_ft/checkpoint-3000")
        config["policy"] = {"family": "pi05", "pi05": {"norm_stats_path": PI05_STATS}}
        error = failed_job(tmp_path, config)
    assert error == (
        f"server.url.urls[0] {url}: refused: server.url.model_id is 'pi05_ft/checkpoint-3000' "
        "but the server's metadata names model 'reference-hold', model_path 'reference://hold': "
        "set server.url.model_id to the model it serves, or point the slot at the server of "
        "'pi05_ft/checkpoint-3000'"
    )


def test_a_url_nothing_answers_fails_after_its_connect_timeout_naming_field_and_url(tmp_path):
    """A port bound but not listening refuses every connection: a wrong port. The slot gives
    up after server.url.connect_timeout_s, not the 900 s of server.health_timeout_s."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        error = failed_job(tmp_path, url_config([url], connect_timeout_s=0.5))
    assert error.startswith(
        f"server.url.urls[0] {url}: nothing answers at {url}/health (connection refused: "
        "nothing listens on that port) after "
    )
    assert "(server.url.connect_timeout_s=0.5). Check the host and port" in error


def test_a_checkpoints_url_nothing_answers_names_its_entry_under_the_checkpoints_name(tmp_path):
    """A training run's servers, listed under each checkpoint's name: the serve job of a
    checkpoint whose server is down names that entry, `server.url.urls.<name>[k]`."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        urls = {"step-1000": ["http://127.0.0.1:1"], "step-2000": [url]}
        config = url_config(urls, model_id="m", connect_timeout_s=0.5)
        config["checkpoints"] = [{"name": "step-1000"}, {"name": "step-2000"}]
        run = checked(config)
        own = run.for_checkpoint(run.checkpoints[1])
        assert own.server(0).url.source == "server.url.urls.step-2000[0]"
        data = own.server(0).to_dict()
        job = subprocess.Popen(
            [
                sys.executable,
                *("-m", "libero_eval.serve.job", "--settings", json.dumps(data)),
                *("--capacity-probe", json.dumps(own.capacity_probe.to_dict())),
                *("--service-file", str(tmp_path / "slot0.json")),
                *("--event-log", str(tmp_path / "eval_embodiment.log")),
            ],
            stdout=(tmp_path / "serve.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        assert job.wait(timeout=READY_WAIT_S) == 1, (tmp_path / "serve.log").read_text()
    error = service(tmp_path)["error"]
    assert error.startswith(f"server.url.urls.step-2000[0] {url}: nothing answers at {url}/health")


class ScriptedHealth(http.server.BaseHTTPRequestHandler):
    """/health answers the codes of ``answers`` in turn, then 200 (a server that loads)."""

    answers: list[int] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def loading_server(answers: list[int]) -> Iterator[str]:
    """A real HTTP server whose /health answers ``answers``, then 200; yields its URL."""
    ScriptedHealth.answers = list(answers)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedHealth)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def url_slot(tmp_path: Path, config: dict[str, Any]) -> UrlSlot:
    settings = checked(config).server(0).to_dict() | {"health_poll_s": 0.01}
    return UrlSlot(ServerSettings.from_dict(settings), tmp_path / "slot0.json", EventLog(None, 0))


def test_a_server_that_answers_but_is_not_ready_is_waited_for_past_the_connect_timeout(tmp_path):
    with loading_server([503, 503, 503]) as url:
        slot = url_slot(tmp_path, url_config([url], connect_timeout_s=0.001))
        assert slot.wait_ready(StopRequest()) is not None  # three 503s, then 200
    assert ScriptedHealth.answers == []
    # ... and one that keeps answering 503 is given up on after server.health_timeout_s
    with loading_server([503] * 10_000) as url:
        config = url_config([url])
        config["server"]["health_timeout_s"] = 0.2
        with pytest.raises(UrlServerError) as failed:
            url_slot(tmp_path, config).wait_ready(StopRequest())
    assert str(failed.value).startswith(
        f"server.url.urls[0] {url}: {url}/health answered HTTP 503, not 200, for "
    )
    assert "(server.health_timeout_s=0.2): the server is up but not ready" in str(failed.value)


# --- the config --------------------------------------------------------------------------------


def test_model_id_names_the_episodes_in_place_of_the_urls():
    one, other = "http://127.0.0.1:30000", "http://127.0.0.1:30002"
    named = checked(url_config([one], model_id="pi05_ft/checkpoint-3000")).fingerprint
    # the same weights behind another port keep their episodes; other weights do not
    assert checked(url_config([other], model_id="pi05_ft/checkpoint-3000")).fingerprint == named
    assert checked(url_config([one], model_id="pi05_ft/checkpoint-4000")).fingerprint != named
    # without model_id the URLs stand for the model, and the log says so once
    unnamed = checked(url_config([one])).fingerprint
    assert unnamed not in (named, checked(url_config([other])).fingerprint)
    (said,) = url_backend_warnings(checked(url_config([one])).config)
    assert said.startswith("server.url.model_id is not set: the episode store is named by")
    # outcome-neutral fields of the section change nothing
    neutral = url_config([one], connect_timeout_s=1, batching_max_size=4)
    assert checked(neutral).fingerprint == unnamed


def test_a_url_server_takes_no_gpu_of_the_workflows():
    run = checked(url_config(["http://127.0.0.1:30000"]))
    assert run.server_on_gpu is False and gpus_per_slot(run.config) == 0
    assert slot_gpu_ids(run.config, 0) is None and run.server(0).gpu_id is None


def test_a_url_on_another_host_is_said_once_with_the_proxy_that_applies(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    remote = "http://gpu-node-7.example:30000"
    config = url_config(["http://127.0.0.1:30000", remote], model_id="m")
    config["server"]["num_slots"] = 2
    (said,) = url_backend_warnings(checked(config).config)
    assert said.startswith(f"server.url.urls[1] {remote} is on another host (gpu-node-7.example)")
    assert via_proxy(remote).startswith(" through the proxy http://proxy.example:3128")
    assert via_proxy("http://127.0.0.1:30000") == ""  # loopback: never through a proxy
    monkeypatch.setenv("NO_PROXY", "gpu-node-7.example")
    assert via_proxy(remote) == ""


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"url": {"urls": []}}, r"server\.url\.urls: required with server\.backend url"),
        (
            {"num_slots": 2, "url": {"urls": ["http://127.0.0.1:1"]}},
            r"server\.url\.urls lists 1 URL\(s\) but server\.num_slots is 2: one server per slot",
        ),
        (
            {"num_slots": 2, "url": {"urls": ["http://127.0.0.1:1", "http://127.0.0.1:1/"]}},
            r"server\.url\.urls\[1\] http://127\.0\.0\.1:1 is server\.url\.urls\[0\] again: .* "
            r"raise rollout\.shards_per_slot",
        ),
        (
            {"url": {"urls": ["127.0.0.1:30000"]}},
            r"server\.url\.urls\.0: '127\.0\.0\.1:30000' does not match .* a server's base URL, "
            r"http://HOST:PORT",
        ),
        (
            {"url": {"urls": {"checkpoint-1000": ["http://127.0.0.1:1"]}}},
            r"server\.url\.urls: a mapping of checkpoint names to URLs is for a run of several "
            r"checkpoints \(checkpoints:\); this run evaluates one: give a list",
        ),
    ],
)
def test_bad_urls_are_refused_naming_the_field(server, message):
    config = url_config(None)
    config["server"] = {"backend": "url", **server}
    with pytest.raises(ConfigError, match=message):
        checked(config)


def test_a_checkpoints_urls_are_read_under_its_name():
    """The form a run of several checkpoints reads (checkpoints:, issue 40): each name's list,
    its fields named so."""
    config = checked(url_config(["http://127.0.0.1:1"])).config
    config["server"]["url"]["urls"] = {"step-1000": ["http://127.0.0.1:1", "http://127.0.0.1:2/"]}
    assert slot_urls(config, "step-1000") == [
        ("server.url.urls.step-1000[0]", "http://127.0.0.1:1"),
        ("server.url.urls.step-1000[1]", "http://127.0.0.1:2"),
    ]
    with pytest.raises(ValueError, match=r"no URLs for checkpoint 'step-2000' \(it lists"):
        slot_urls(config, "step-2000")


# --- the workflow --------------------------------------------------------------------------------


@pytest.mark.workflow
@pytest.mark.libero
def test_a_run_against_a_warm_user_server_records_its_episodes_and_leaves_it_serving(tmp_path):
    """One real Snakemake run with LIBERO against the reference server run as a user runs one:
    the episodes are recorded from it, its start is the check and the probe (no cold start),
    and after the workflow ends it is still alive and serving, ready for the next run."""
    workdir = workflow_dir(tmp_path / "work")
    run_id = f"pytest_url_{tmp_path.name}"
    with user_server(tmp_path) as (url, server):
        configfile = tmp_path / "config.yaml"
        config = url_config([url], model_id="reference-hold")
        config.update(run_id=run_id, plan={"task_ids": [0], "num_trials_per_task": 2})
        config["rollout"]["max_steps"] = 16
        configfile.write_text(yaml.safe_dump(config))
        run = subprocess.run(
            [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", str(configfile)],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ},
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Config warning" not in run.stderr  # loopback, and the weights are named
        results = workdir / "results" / run_id
        episodes = pd.read_parquet(results / "summary" / "episodes.parquet")
        assert len(episodes) == 2 and episodes["error"].isna().all()
        assert (episodes["server_url"] == url).all()
        # its start was the check and the probe, in the service file as the shard saw it at
        # ready (its dispatch log keeps it: Snakemake removes a service output when the group
        # job ends, here often before the serve job's last write) and the report's timeline
        seen = json.loads((results / "shards" / "shard000.dispatch.json").read_text())["server"]
        assert set(seen["startup_parts"]) == {"health", "probe"}
        assert seen["capacity"]["obs_per_s"] > 0
        timeline = pd.read_csv(results / "summary" / "efficiency.csv").iloc[0]
        assert timeline["capacity_obs_per_s"] == seen["capacity"]["obs_per_s"]
        steps = seen["timeline"]
        assert timeline["start_to_ready_s"] == pytest.approx(
            steps["ready"] - steps["launch"], abs=0.05
        )
        log = (workdir / "logs" / run_id / "eval_embodiment.log").read_text()
        assert f"server left running: {url}" in log and "] server launch: " not in log
        stopped = read_service_file(results / "servers" / "slot0.json")
        if stopped is not None:  # written again after Snakemake removed it
            assert stopped["status"] == "stopped" and stopped["left_running"] is True
        # the server outlived the workflow and still serves
        assert server.poll() is None and answers_health(url)
        assert checked(config).capacity_probe(url)["obs_per_s"] > 0


def test_a_training_run_against_user_servers_gives_each_checkpoint_its_own():
    """`checkpoints:` named, each served by servers the user runs: each checkpoint's slots
    take its URLs and its episodes their own store; one list for several checkpoints is
    refused naming the field."""
    config = url_config(
        {"step-1000": ["http://127.0.0.1:1"], "step-2000": ["http://127.0.0.1:2"]}, model_id="m"
    )
    config["checkpoints"] = [{"name": "step-1000", "step": 1000}, {"name": "step-2000"}]
    run = checked(config)
    checkpoints = run.checkpoints
    assert [c.name for c in checkpoints] == ["step-1000", "step-2000"]
    own = [run.for_checkpoint(c) for c in checkpoints]
    assert [o.server(0).url.url for o in own] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert own[0].fingerprint != own[1].fingerprint
    config["server"]["url"]["urls"] = ["http://127.0.0.1:1"]
    with pytest.raises(ConfigError, match=r"server\.url\.urls is a list with 2 checkpoints"):
        checked(config)
    config["server"]["url"]["urls"] = {"step-1000": ["http://127.0.0.1:1"]}
    with pytest.raises(ConfigError, match=r"lists no servers for checkpoint 'step-2000'"):
        checked(config)
