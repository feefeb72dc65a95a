"""toyvla served by the CPU reference server through the part it brings
(``reference_server.py`` beside this file), over real HTTP: the server runs in a process of its
own, which finds the family by the module named on its command line (``--family-module``, as
the serve job passes the one of ``policy.family_modules``), never by importing it itself."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from libero_eval.policy.adapter import Observation
from libero_eval.policy.connection import connect
from libero_eval.policy.errors import PolicyRequestRejected
from toyvla import ACT_PATH, READY_PATH, ToyVlaAdapter, endpoint

HERE = Path(__file__).resolve().parent
STILL_OPEN = [0.0] * 6 + [-1.0]  # the reference server's `hold` policy: still, gripper open


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """The reference server serving toyvla, `hold` as its policy, ready."""
    port, log = free_port(), tmp_path_factory.mktemp("toyvla") / "server.log"
    paths = [str(HERE.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    command = [sys.executable, "-m", "libero_eval.reference.server", "--port", str(port)]
    command += ["--policy", "hold", "--max-batch-size", "4"]
    command += ["--family", "toyvla", "--family-module", "toyvla"]
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # the start's bound, not a race: it ends at readiness
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if requests.get(base + READY_PATH, timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def observation(brightness: int) -> Observation:
    frame = np.full((8, 8, 3), brightness, np.uint8)
    return Observation(agentview=frame, wrist=frame, task_language="pick up the bowl")


def test_the_adapter_gets_the_server_policys_actions_through_toyvlas_own_routes(url):
    adapter = ToyVlaAdapter({"chunk": 8, "gripper": "closed"})
    with connect(endpoint(url, {}), max_retries=0) as client:
        assert client.health()  # toyvla's readiness path, served by its part
        response = client.infer(adapter.build_request([observation(10), observation(200)], "r1"))
    assert response["server"] == "toyvla" and response["model"] == "reference-hold"
    actions = adapter.parse_response(response, 2)
    # the reference server's policy decides (hold: open), not the request's gripper (closed)
    np.testing.assert_array_equal(actions, np.tile(STILL_OPEN, (2, 8, 1)))
    stats = requests.get(url + "/v1/stats", timeout=10).json()  # the server's own route
    assert stats["requests"] >= 1 and stats["items"] >= 2 and stats["policy"] == "hold"


def test_a_request_that_is_not_toyvlas_is_refused_and_counted(url):
    rejected = requests.get(url + "/v1/stats", timeout=10).json()["rejected"]
    adapter = ToyVlaAdapter({"chunk": 8, "gripper": "open"})
    too_many = adapter.build_request([observation(1)] * 5, "r2")  # the server's batch is 4
    with connect(endpoint(url, {}), max_retries=0) as client:
        with pytest.raises(PolicyRequestRejected, match="brightness: 1 to 4 observations"):
            client.infer(too_many)
        with pytest.raises(PolicyRequestRejected, match="chunk: a positive integer"):
            client.infer({**adapter.build_request([observation(1)], "r3"), "chunk": 0})
    assert requests.get(url + "/v1/stats", timeout=10).json()["rejected"] == rejected + 2


def test_the_server_speaks_the_familys_routes_only(url):
    assert requests.post(url + ACT_PATH, data=b"not json", timeout=10).status_code == 400
    # another family's route is not there: the server asks the registry for toyvla's alone
    assert requests.get(url + "/v1/actions/metadata", timeout=10).status_code == 404
    assert requests.get(url + "/health", timeout=10).json() == {"status": "ok"}
