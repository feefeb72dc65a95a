"""benchmarks/server_threads.py: the servers of a thread sweep wait paused, take no CPU while
paused, and are all torn down, paused or not (the fake `sglang` of tests/fake_sglang, with
child processes)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from libero_eval.serve.launcher import ManagedServer
from libero_eval.serve.settings import ServerSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import server_threads  # noqa: E402

FAKE_SGLANG = Path(__file__).parent / "fake_sglang" / "sglang"


def fake_server(tmp_path: Path, name: str) -> ManagedServer:
    settings = ServerSettings.from_dict(
        {
            "backend": "sglang",
            "slot": 0,
            "port": 0,
            "health_timeout_s": 20,
            "health_poll_s": 0.05,
            "teardown_grace_s": 1.0,
            "extra_env": {
                "FAKE_SGLANG_CHILDREN": "2",
                "FAKE_SGLANG_PIDS_FILE": str(tmp_path / f"{name}.pids"),
            },
            "sglang": {"command": [str(FAKE_SGLANG)], "model_path": "/models/pi05"},
        }
    )
    server = ManagedServer(settings)
    with open(tmp_path / f"{name}.log", "ab") as log:
        server.start(log)
    server.wait_healthy()
    deadline = time.monotonic() + 15
    while len(server_threads.members(server)) < 3:  # the leader and its two children
        assert time.monotonic() < deadline, "the fake's children never started"
        time.sleep(0.05)
    return server


def statuses(pids: list[int]) -> set[str]:
    found = set()
    for pid in pids:
        try:
            found.add(psutil.Process(pid).status())
        except psutil.NoSuchProcess:
            found.add("gone")
    return found


def wait_for(pids: list[int], want: set[str] | None, avoid: str | None = None) -> set[str]:
    deadline = time.monotonic() + 10
    while True:
        now = statuses(pids)
        if (want is not None and now == want) or (avoid is not None and avoid not in now):
            return now
        if time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def test_a_paused_server_stops_every_process_and_resumes_them_all(tmp_path):
    server = fake_server(tmp_path, "a")
    pids = [p.pid for p in server_threads.members(server)]
    try:
        server_threads.pause(server)
        assert wait_for(pids, {psutil.STATUS_STOPPED}) == {psutil.STATUS_STOPPED}
        used = server_threads.cpu_seconds(server)
        time.sleep(0.5)
        assert server_threads.cpu_seconds(server) == used  # paused: no CPU at all
        server_threads.resume(server)
        assert psutil.STATUS_STOPPED not in wait_for(pids, None, avoid=psutil.STATUS_STOPPED)
    finally:
        teardown = server_threads.stop_all([server])
    assert teardown["processes_left"] == 0 and teardown["server_processes"] == 3


def test_teardown_resumes_paused_servers_and_leaves_no_process(tmp_path):
    servers = [fake_server(tmp_path, "a"), fake_server(tmp_path, "b")]
    pids = [p.pid for server in servers for p in server_threads.members(server)]
    for server in servers:
        server_threads.pause(server)
    assert wait_for(pids, {psutil.STATUS_STOPPED}) == {psutil.STATUS_STOPPED}
    teardown = server_threads.stop_all(servers)
    assert teardown["server_processes"] == 6 and teardown["processes_left"] == 0
    assert all(code is not None for code in teardown["exit_codes"])
    assert wait_for(pids, {"gone"}) == {"gone"}
