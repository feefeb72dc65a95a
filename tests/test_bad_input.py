"""Bad input: each gets an error naming what is wrong and how to fix it, and loses nothing.

Config errors are checked through the real `snakemake` command (in a private working
directory holding one finished episode record that must survive). Broken policy servers are
real HTTP servers on loopback answering garbage, HTTP 500 or too slowly.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_record, workflow_dir

from libero_eval.analysis.aggregate import write_summary
from libero_eval.config import RunSettings, validate_config
from libero_eval.plan import Episode, make_shards, plan_table
from libero_eval.rollout.shard_run import run_shard
from libero_eval.rollout.shard_settings import ShardFailed
from libero_eval.serve.command import ServerHostError, check_host, exposure_warning
from libero_eval.store import EpisodeStore, read_results, write_results

REPO = Path(__file__).resolve().parents[1]
EPISODES = [Episode("libero_spatial", 0, 0), Episode("libero_spatial", 0, 1)]


def full_config(**sections) -> dict:
    """A config with every default filled in by the schema, as the workflow sees it."""
    config = {"run_id": "bad_input", **sections}
    validate_config(config)
    return config


def finished_record(episode: Episode) -> dict:
    return make_record(
        run_id="bad_input",
        suite=episode.suite,
        task_id=episode.task_id,
        task_language="pick up the black bowl",
        init_state_id=episode.init_state_id,
        first_success_step=77,
        policy_latency_p95_s=0.1,
        wall_time_s=10.0,
        finished_at=1.0,
    )


# ----------------------------------------------------------------------------- config


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A private working directory with one finished episode record already in its store."""
    workflow_dir(tmp_path)
    record = tmp_path / "results/bad_input/episodes/abc/libero_spatial/task00_init00.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps(finished_record(EPISODES[0])))
    return tmp_path


def snakemake_error(workdir: Path, config_text: str) -> str:
    """Run the workflow with this config; it must fail and keep the finished record."""
    record = workdir / "results/bad_input/episodes/abc/libero_spatial/task00_init00.json"
    before = record.read_bytes()
    (workdir / "my.yaml").write_text(config_text)
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "my.yaml"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert record.read_bytes() == before
    return result.stdout + result.stderr


def test_missing_config_field_is_named_with_the_fix(workdir):
    error = snakemake_error(workdir, "run_id: bad_input\nserver: {backend: sglang}\n")
    assert "server.sglang.model_path is not set" in error
    assert "model_diffusers/ directory" in error


def test_malformed_config_file_is_reported_as_such(workdir):
    error = snakemake_error(workdir, "run_id: bad_input\nrollout: {max_steps: 16\n")
    assert "Config file is not valid JSON or YAML" in error


def test_wrong_type_config_field_is_named_with_the_expected_type(workdir):
    error = snakemake_error(workdir, "run_id: bad_input\nrollout: {max_steps: ten}\n")
    assert "'ten' is not of type 'integer', 'null'" in error
    assert "rollout.max_steps: 'ten' is not of type" in error  # the field named
    assert "Override the protocol's step limit" in error  # the field's description


def test_run_id_with_a_trailing_newline_is_named(workdir):
    error = snakemake_error(workdir, 'run_id: "bad_input\\n"\n')
    assert "run_id: 'bad_input\\n' does not match" in error
    assert not (workdir / "results" / "bad_input\n").exists()


def test_gpu_ids_shorter_than_the_slots_are_named_with_the_fix(workdir):
    # (a shipped 8-slot config with an overlay of gpu_ids: [0] said "server.gpu_id: [] should
    # be non-empty", a field the user never wrote)
    error = snakemake_error(workdir, "run_id: bad_input\nserver: {num_slots: 2, gpu_ids: [0]}\n")
    assert "server.gpu_ids lists 1 devices but 2 slots x 1 GPUs each need 2" in error
    assert "server.gpu_id:" not in error


def test_misspelled_config_field_is_named(workdir):
    error = snakemake_error(workdir, "run_id: bad_input\nrollout: {max_stepz: 16}\n")
    assert "'max_stepz' was unexpected" in error


def test_nonexistent_stats_path_is_named_with_the_fix(workdir):
    error = snakemake_error(
        workdir,
        "run_id: bad_input\nserver: {reference: {policy: hold}}\n"
        "policy: {cosmos3: {action_stats_path: /nonexistent/stats.json}}\n",
    )
    assert "policy.cosmos3.action_stats_path: /nonexistent/stats.json does not exist" in error
    assert "point it at a Cosmos3 action-stats JSON" in error


def test_nonexistent_model_path_is_named_with_the_fix(workdir):
    error = snakemake_error(
        workdir,
        "run_id: bad_input\nrollout: {send_privileged_state: false}\n"
        "server: {backend: sglang, sglang: {model_path: /nonexistent/model_diffusers}}\n",
    )
    assert "server.sglang.model_path: /nonexistent/model_diffusers has no model_index.json" in error


def test_stats_file_of_the_wrong_shape_is_named_with_the_fix(workdir):
    stats = json.loads(
        (
            REPO / "src/libero_eval/data/stats/libero_native_frame_wise_relative_rot6d.json"
        ).read_text()
    )
    stats["global_raw"]["q01"] = stats["global_raw"]["q01"][:7]  # LIBERO's 7-D, not Cosmos3's 10
    (workdir / "stats7.json").write_text(json.dumps(stats))
    error = snakemake_error(
        workdir,
        "run_id: bad_input\nserver: {reference: {policy: hold}}\n"
        "policy: {cosmos3: {action_stats_path: stats7.json}}\n",
    )
    assert "policy.cosmos3.action_stats_path: action stats file stats7.json" in error
    assert "block 'global_raw', key 'q01': expected a list of 10 numbers, got length 7" in error


HOST_CONFIG = (
    "run_id: bad_input\nplan: {task_ids: [0], num_trials_per_task: 1}\n"
    "server: {host: 192.0.2.1, reference: {policy: hold}}\n"
)


@pytest.mark.workflow
def test_a_host_that_cannot_be_bound_is_named_with_the_fix_and_warned_of_once(workdir):
    """192.0.2.1 (TEST-NET-1, on no interface here): the serve job fails before any server
    starts, naming server.host and the fix, and its shards fail at once with its reason
    (there was a traceback, OSError: [Errno 99], after Snakemake's "filesystem latency" hint).
    A host other than loopback is warned of once per run."""
    error = snakemake_error(workdir, HOST_CONFIG)
    refused = "server.host '192.0.2.1' cannot be bound on this machine"
    serve_log = (workdir / "logs/bad_input/serve/slot0.log").read_text()
    assert refused in serve_log and "Set server.host to 127.0.0.1" in serve_log
    assert "Traceback" not in serve_log
    shard_log = (workdir / "logs/bad_input/rollout/shard000.log").read_text()
    assert f"slot0.json is failed: {refused}" in shard_log
    assert error.count("Config warning: server.host '192.0.2.1'") == 1
    assert "no authentication" in error


@pytest.mark.parametrize(
    ("host", "warned"),
    [("127.0.0.1", None), ("localhost", None), ("::1", None), ("127.0.1.1", None)]
    + [("0.0.0.0", "every network interface"), ("::", "every network interface")]
    + [("192.0.2.1", "listen on 192.0.2.1")],
)
def test_a_host_other_than_loopback_is_warned_of(host, warned):
    warning = exposure_warning(host)
    if warned is None:
        assert warning is None
    else:
        assert warning.startswith(f"server.host {host!r}: the policy servers listen on")
        assert warned in warning and "Keep the default 127.0.0.1" in warning


def test_an_unresolvable_host_is_named_before_any_server_starts():
    with pytest.raises(ServerHostError, match=r"server.host 'no-such-host.invalid' cannot be"):
        check_host("no-such-host.invalid")
    check_host("127.0.0.1")  # loopback binds


# ----------------------------------------------------------------------------- servers


class BrokenServer(BaseHTTPRequestHandler):
    """/health answers 200; every other path answers as `mode` says."""

    mode = "garbage"
    metadata_ok = False

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self) -> None:
        if self.path == "/health":
            return self._send(200, b"{}", "application/json")
        if self.path == "/v1/actions/metadata" and self.metadata_ok:
            meta = {"capabilities": {"max_batch_size": 8}}
            return self._send(200, json.dumps(meta).encode(), "application/json")
        if self.mode == "garbage":
            return self._send(200, b"<html>502 from a proxy</html>", "application/json")
        if self.mode == "http500":
            return self._send(500, b'{"detail": "CUDA out of memory"}', "application/json")
        time.sleep(3)  # "timeout"
        return self._send(200, b"{}", "application/json")

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()


@pytest.fixture
def broken_server(request) -> Iterator[str]:
    mode, metadata_ok = request.param
    handler = type("Handler", (BrokenServer,), {"mode": mode, "metadata_ok": metadata_ok})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def shard_against(tmp_path: Path, url: str, **rollout) -> tuple:
    config = full_config(
        server={"reference": {"policy": "hold"}},
        rollout={
            "max_steps": 16,
            "camera_size": 64,
            "envs_per_shard": 1,
            "failures": {"request_timeout_s": 0.5, "request_retries": 2, "retry_backoff_s": 0.05},
            **rollout,
        },
    )
    settings = RunSettings(config).shard_settings("shard000", 0, 1)
    store = EpisodeStore(tmp_path / "episodes")
    store.write(EPISODES[0], finished_record(EPISODES[0]))
    return settings, store


@pytest.mark.parametrize(
    ("broken_server", "expected"),
    [
        (("garbage", False), "answered HTTP 200 with an undecodable application/json body"),
        (("http500", False), "HTTP 500: 'CUDA out of memory'"),
        (("timeout", False), "timed out after 0.5 s"),
    ],
    indirect=["broken_server"],
    ids=["garbage", "http500", "timeout"],
)
def test_broken_server_fails_the_shard_clearly_and_keeps_finished_episodes(
    tmp_path, broken_server, expected
):
    settings, store = shard_against(tmp_path, broken_server)
    before = store.path_for(EPISODES[0]).read_bytes()
    output = tmp_path / "shard000.parquet"
    with pytest.raises(ShardFailed) as error:
        run_shard(EPISODES, settings, store, broken_server, output, progress=False)
    message = str(error.value)
    assert f"shard000: policy server {broken_server} is not usable" in message
    assert expected in message
    assert "Check that the policy server is up" in message or "first bytes" in message
    assert store.path_for(EPISODES[0]).read_bytes() == before
    assert not output.exists()


@pytest.mark.libero
@pytest.mark.parametrize("broken_server", [("garbage", True)], indirect=True)
def test_server_answering_garbage_to_every_request_fails_the_shard(tmp_path, broken_server):
    """Unusable answers are episode errors at first; three in a row fail the shard. The
    episode finished before is kept; the others are rerun next time."""
    episodes = [*EPISODES, Episode("libero_spatial", 0, 2), Episode("libero_spatial", 0, 3)]
    settings, store = shard_against(tmp_path, broken_server)
    before = store.path_for(EPISODES[0]).read_bytes()
    with pytest.raises(ShardFailed, match="gave 3 unusable answers in a row") as error:
        run_shard(episodes, settings, store, broken_server, tmp_path / "s.parquet", progress=False)
    assert broken_server in str(error.value)
    assert store.path_for(EPISODES[0]).read_bytes() == before
    # the first two unusable answers were recorded as episode errors, the third failed the shard
    errors = [(store.load(ep) or {}).get("error") or "" for ep in episodes[1:]]
    assert ["bad policy response" in e for e in errors] == [True, True, False]
    assert list(store.finished(episodes)) == [EPISODES[0]]


# ----------------------------------------------------------------------------- a hung server


class HungServer(BaseHTTPRequestHandler):
    """/health and the metadata answer; a generation request is held until `hang.release` is
    set, then rejected (HTTP 400). `hang.frozen`: once a generation request came, /health
    stops answering too (a server that answers nothing at all)."""

    hang: Hang

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up

    def do_GET(self) -> None:
        if self.path == "/v1/actions/metadata":
            return self._send(200, json.dumps({"capabilities": {"max_batch_size": 8}}).encode())
        if self.hang.frozen and self.hang.generations:
            self.hang.release.wait()  # no answer
            return None
        return self._send(200, b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.hang.generations += 1
        self.hang.release.wait()
        self._send(400, b'{"detail": "released by the test"}')


@dataclass
class Hang:
    frozen: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    generations: int = 0


@pytest.fixture
def hung_server(request) -> Iterator[tuple[str, Hang]]:
    hang = Hang(frozen=request.param)
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (HungServer,), {"hang": hang}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hang
    hang.release.set()
    server.shutdown()
    server.server_close()


def release_when_logged(event_log: Path, hang: Hang, seen: list[str]) -> threading.Thread:
    """A thread that waits for the shard's waiting line in the event log, keeps it in `seen`
    and lets the held request be answered (at the latest after 300 s: the test then fails)."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not seen:
            text = event_log.read_text() if event_log.exists() else ""
            seen.extend(line for line in text.splitlines() if "waiting for policy server" in line)
            time.sleep(0.05)
        hang.release.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.libero
@pytest.mark.parametrize("hung_server", [False], indirect=True)
def test_a_shard_waiting_for_an_answer_logs_its_age_and_the_settings(tmp_path, hung_server):
    """A request held at the server (600 s timeout) is logged while it waits, naming its age
    and the settings that bound it; the finished episode is kept when the shard ends."""
    url, hang = hung_server
    failures = {"request_timeout_s": 600, "waiting_log_every_s": 0.2}
    settings, store = shard_against(tmp_path, url, failures=failures)
    settings = dataclasses.replace(settings, event_log=tmp_path / "eval_embodiment.log")
    before = store.path_for(EPISODES[0]).read_bytes()
    seen: list[str] = []
    watcher = release_when_logged(settings.event_log, hang, seen)
    with pytest.raises(ShardFailed, match="rejected with HTTP 400"):
        run_shard(EPISODES, settings, store, url, tmp_path / "s.parquet", progress=False)
    watcher.join()
    assert seen, "no waiting line in the event log"
    assert f"[rollout shard000] waiting for policy server {url}: 1 request(s) unanswered" in seen[0]
    assert "rollout.failures.request_timeout_s=600 s" in seen[0]
    assert "rollout.failures.request_retries=5" in seen[0]
    assert store.path_for(EPISODES[0]).read_bytes() == before


@pytest.mark.libero
@pytest.mark.parametrize("hung_server", [True], indirect=True)
def test_a_server_that_answers_nothing_fails_the_shard_after_one_try(tmp_path, hung_server):
    """Its request times out and /health gets no answer either: the shard fails at once (not
    after request_retries more timeouts), naming the URL and the settings, and keeps what
    finished."""
    url, hang = hung_server
    failures = {"request_timeout_s": 1, "request_retries": 5, "retry_backoff_s": 0.05}
    settings, store = shard_against(tmp_path, url, failures=failures)
    before = store.path_for(EPISODES[0]).read_bytes()
    with pytest.raises(ShardFailed) as error:
        run_shard(EPISODES, settings, store, url, tmp_path / "s.parquet", progress=False)
    message = str(error.value)
    assert hang.generations == 1
    assert f"shard000: policy server {url} failed: POST {url}/v1/actions/generations" in message
    assert "timed out after 1 s (rollout.failures.request_timeout_s" in message
    assert "Gave up before rollout.failures.request_retries ran out" in message
    assert f"{url}/health did not answer either" in message
    assert store.path_for(EPISODES[0]).read_bytes() == before
    assert list(store.finished(EPISODES)) == [EPISODES[0]]


# ----------------------------------------------------------------------------- shard tables


def test_truncated_shard_table_is_named_and_rebuilt_from_the_store_without_rerunning(tmp_path):
    store = EpisodeStore(tmp_path / "episodes")
    for episode in EPISODES:
        store.write(episode, finished_record(episode))
    shard = tmp_path / "shards/shard000.parquet"
    write_results([store.load(ep) for ep in EPISODES], shard)
    original = read_results([shard])
    plan = tmp_path / "plan.csv"
    plan_table(make_shards(EPISODES, 1, 1)).to_csv(plan, index=False)
    shard.write_bytes(shard.read_bytes()[:200])  # a crash or a full disk cut it

    outputs = {name: str(tmp_path / "summary" / name) for name in ("episodes", "tables")}
    with pytest.raises(ValueError, match="shard000.parquet: not a readable Parquet file") as error:
        write_summary([str(shard)], str(plan), outputs, "bad_input")
    assert "delete it and rerun the workflow" in str(error.value)

    # The fix: delete it and rerun; the shard is rebuilt from the store with no server and
    # no env (every episode is finished), so nothing is rerun.
    shard.unlink()
    config = full_config(server={"reference": {"policy": "hold"}})
    settings = RunSettings(config).shard_settings("shard000", 0, 1)
    run_shard(EPISODES, settings, store, "", shard, progress=False)
    pd.testing.assert_frame_equal(read_results([shard]), original)
