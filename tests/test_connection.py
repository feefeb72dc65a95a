"""One connection interface: the endpoint picks the implementation; π0.5's adapter class per
API; the env worker's messages (no LIBERO, no server)."""

from __future__ import annotations

import pytest
from test_pi05_adapter import STATS, observation

from libero_eval.policy.adapters import make_adapter
from libero_eval.policy.adapters.pi05 import (
    Pi05Adapter,
    Pi05OpenpiServerAdapter,
    Pi05SglangHttpAdapter,
    Pi05SglangWebsocketAdapter,
)
from libero_eval.policy.connection import ConnectionSpec, connect, policy_connection_spec
from libero_eval.policy.http_connection import HttpConnection
from libero_eval.policy.ws_connection import WebsocketConnection
from libero_eval.rollout.env_worker import Command, Reply, Status

URL = "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("family", "settings", "kind", "wire", "path", "health"),
    [
        ("cosmos3", {"transport": "msgpack"}, HttpConnection, "msgpack", "", "/health"),
        ("cosmos3", {"transport": "png_base64"}, HttpConnection, "json", "", "/health"),
        ("pi05", {"pi05": {}}, HttpConnection, "msgpack", "", "/health"),
        ("pi05", {"pi05": {"wire_format": "json"}}, HttpConnection, "json", "", "/health"),
        (
            "pi05",
            {"pi05": {"api": "sglang_websocket"}},
            WebsocketConnection,
            "msgpack",
            "/openpi/policy",
            "/health",
        ),
        (
            "pi05",
            {"pi05": {"api": "openpi_websocket", "wire_format": "json"}},
            WebsocketConnection,
            "msgpack",
            "",
            "/healthz",
        ),
    ],
)
def test_the_endpoint_picks_the_connection(family, settings, kind, wire, path, health):
    spec = policy_connection_spec(URL, family, settings)
    assert (spec.wire_format, spec.path, spec.health_path) == (wire, path, health)
    with connect(spec, max_retries=0) as connection:
        assert type(connection) is kind and connection.health_path == health
        if kind is HttpConnection:
            assert connection.wire_format == wire
        else:
            assert connection.ws_url == "ws://127.0.0.1:1" + (path or "/")
            assert connection.max_batch_size() == 1


@pytest.mark.parametrize(
    ("family", "settings", "message"),
    [
        ("cosmos3", {"transport": "grpc"}, "policy.cosmos3.transport must be one of"),
        ("pi05", {"pi05": {"api": "grpc"}}, "policy.pi05.api must be one of"),
        ("pi05", {"pi05": None}, "policy.pi05 must be a mapping"),
    ],
)
def test_bad_endpoint_settings_name_the_field(family, settings, message):
    with pytest.raises(ValueError, match=message):
        policy_connection_spec(URL, family, settings)


def test_a_websocket_endpoint_speaks_msgpack_only():
    with pytest.raises(ValueError, match="msgpack only"):
        ConnectionSpec(URL, "websocket", "json")
    with pytest.raises(ValueError, match="channel 'grpc'"):
        ConnectionSpec(URL, "grpc")


@pytest.mark.parametrize(
    ("api", "kind"),
    [
        ("sglang_http", Pi05SglangHttpAdapter),
        ("sglang_websocket", Pi05SglangWebsocketAdapter),
        ("openpi_websocket", Pi05OpenpiServerAdapter),
    ],
)
def test_each_pi05_api_is_its_own_adapter_class(api, kind):
    settings = {"pi05": {"api": api, "norm_stats_path": str(STATS)}}
    for adapter in (Pi05Adapter(settings), make_adapter("pi05", settings)):
        assert type(adapter) is kind and isinstance(adapter, Pi05Adapter)
        assert adapter.api == api
        assert adapter.build_request([observation()], "r")


def test_worker_messages_are_typed_and_keep_their_wire_names():
    assert [c.value for c in Command] == ["start", "chunk", "close"]
    assert Status.OK == "ok" and Status("died") is Status.DIED
    status, result = Reply(Status.ERROR, "boom")
    assert status is Status.ERROR and result == "boom"


def test_a_family_module_with_an_adapter_entry_is_registered_without_editing_the_package(
    tmp_path, monkeypatch
):
    """docs/design.md "Adding a policy family": the adapter module is found by its ADAPTER."""
    from libero_eval.policy import adapters

    (tmp_path / "toyfam.py").write_text(
        "from libero_eval.policy.adapters.base import PolicyAdapter\n"
        "class ToyAdapter(PolicyAdapter):\n"
        "    family = 'toyfam'\n"
        "    @classmethod\n"
        "    def check_run_config(cls, config): pass\n"
        "    def __init__(self, settings): self.settings = settings\n"
        "    def prompt_key(self, obs): return ''\n"
        "    def build_request(self, observations, request_id): return {}\n"
        "    def parse_response(self, response, batch_size): return None\n"
        "    def outcome_settings(self): return {}\n"
        "ADAPTER = ToyAdapter\n"
    )
    monkeypatch.setattr(adapters, "__path__", [*adapters.__path__, str(tmp_path)])
    found = adapters._discover()
    assert set(found) == {"cosmos3", "pi05", "toyfam"}
    assert found["toyfam"].__name__ == "ToyAdapter"
    # served by SGLang's HTTP action API unless connection.py says otherwise
    spec = policy_connection_spec(URL, "toyfam", {})
    assert (spec.channel, spec.wire_format, spec.health_path) == ("http", "msgpack", "/health")
