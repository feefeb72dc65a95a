"""The launcher's openpi backend: a configurable openpi server command with the same lifecycle
guarantees as SGLang's (readiness on openpi's /healthz, teardown of the whole tree).

A fake openpi server (tests/fake_sglang/openpi_serve_policy) stands in for openpi's
`scripts/serve_policy.py`: it speaks openpi's websocket protocol and its /healthz.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from test_launcher import survivors, wait_for_pids

from libero_eval.policy.ws_connection import WebsocketConnection
from libero_eval.serve.command import build_command
from libero_eval.serve.launcher import ManagedServer
from libero_eval.serve.settings import ServerSettings, ServerSettingsError
from libero_eval.service import wait_for_service, write_service_file

FAKE_OPENPI = Path(__file__).parent / "fake_sglang" / "openpi_serve_policy"


def openpi_settings(tmp_path: Path, command: list[str], **openpi) -> ServerSettings:
    return ServerSettings.from_dict(
        {
            "backend": "openpi",
            "slot": 0,
            "port": 0,
            "health_timeout_s": 20,
            "health_poll_s": 0.05,
            "teardown_grace_s": 0.5,
            "extra_env": {
                "FAKE_OPENPI_RECORD_FILE": str(tmp_path / "record.json"),
                "FAKE_OPENPI_PIDS_FILE": str(tmp_path / "pids.txt"),
                "FAKE_OPENPI_CHILD": "1",
            },
            "openpi": {"command": command, **openpi},
        }
    )


def test_the_port_goes_where_the_command_says_or_at_the_end(tmp_path):
    settings = openpi_settings(
        tmp_path,
        ["uv", "run", "scripts/serve_policy.py", "--port", "{port}", "policy:checkpoint"],
    )
    assert settings.health_path == "/healthz"
    pinned = ServerSettings.from_dict({**settings_dict(settings), "port": 8123})
    assert build_command(pinned) == [
        "uv",
        "run",
        "scripts/serve_policy.py",
        "--port",
        "8123",
        "policy:checkpoint",
    ]
    plain = ServerSettings.from_dict(
        {**settings_dict(settings), "port": 8123, "openpi": {"command": ["serve", "--env", "X"]}}
    )
    assert build_command(plain) == ["serve", "--env", "X", "--port", "8123"]


def settings_dict(settings: ServerSettings) -> dict:
    return {
        "backend": "openpi",
        "slot": settings.slot,
        "openpi": {"command": settings.openpi.command},
    }


@pytest.mark.parametrize(
    ("openpi", "message"),
    [
        ({}, r"server\.openpi\.command: required"),
        # the schema's minItems, in jsonschema's words (older releases: "is too short")
        ({"command": []}, r"server\.openpi\.command: \[\] (should be non-empty|is too short)"),
        ({"command": ["serve", "--port", "8000"]}, "do not pass --port yourself"),
        (
            {"command": ["serve"], "health_path": "healthz"},
            r"server\.openpi\.health_path: 'healthz' does not match .*\(starting with /\)",
        ),
    ],
)
def test_bad_openpi_settings_name_the_field(openpi, message):
    with pytest.raises(ServerSettingsError, match=message):
        ServerSettings.from_dict({"backend": "openpi", "slot": 0, "openpi": openpi})


def test_openpi_server_lifecycle_health_serving_and_teardown(tmp_path):
    command = [
        sys.executable,
        str(FAKE_OPENPI),
        "--env",
        "LIBERO",
        "--port",
        "{port}",
        "policy:checkpoint",
    ]
    server = ManagedServer(openpi_settings(tmp_path, command, cwd=str(tmp_path)))
    with open(tmp_path / "server.log", "ab") as log:
        server.start(log)
    try:
        server.wait_healthy()  # on /healthz: openpi has no /health
        record = json.loads((tmp_path / "record.json").read_text())
        port = str(server.settings.port)
        assert record["argv"] == ["--env", "LIBERO", "--port", port, "policy:checkpoint"]
        assert Path(record["cwd"]) == tmp_path
        service = tmp_path / "slot0.json"
        write_service_file(
            service, {"status": "ready", "url": server.url, "health_path": "/healthz"}
        )
        assert wait_for_service(service, timeout_s=10)["url"] == server.url
        with WebsocketConnection(server.url, health_path="/healthz", max_retries=0) as client:
            assert client.health()
            actions = client.infer({"prompt": "x", "observation/state": np.zeros(8)})
            assert actions["actions"].shape == (10, 7)
        pids = wait_for_pids(tmp_path, 2)
    finally:
        server.stop()
    assert set(pids) == {"server", "child"}
    assert survivors(list(pids.values()), within_s=0.0) == []  # the SIGTERM-deaf child too
