"""One connection interface: the endpoint picks the implementation; π0.5's adapter class per
API; the env worker's messages (no LIBERO, no server)."""

from __future__ import annotations

import copy

import pytest
from test_pi05_adapter import STATS, observation

from libero_eval.policy.connection import ConnectionSpec, connect, policy_connection_spec
from libero_eval.policy.families import make_adapter
from libero_eval.policy.families.pi05.adapter import (
    Pi05Adapter,
    Pi05OpenpiServerAdapter,
    Pi05SglangHttpAdapter,
    Pi05SglangWebsocketAdapter,
)
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


TOY_FAMILY = """
from libero_eval.policy.adapter import PolicyAdapter
from libero_eval.policy.endpoint import ConnectionSpec
from libero_eval.policy.families import Family

class ToyAdapter(PolicyAdapter):
    family = "toyfam"
    @classmethod
    def check_run_config(cls, config): pass
    def __init__(self, settings): self.settings = settings
    def prompt_key(self, obs): return ""
    def build_request(self, observations, request_id): return {}
    def parse_response(self, response, batch_size): return None
    def outcome_settings(self): return {}

FAMILY = Family(
    name="toyfam",
    title="Toy",
    adapter=ToyAdapter,
    endpoint=lambda url, settings: ConnectionSpec(
        url, path="/act", health_path="/ready", metadata_path=None
    ),
    backends=("sglang",),
    schema={
        "type": "object",
        "default": {},
        "properties": {"gain": {"type": "number", "default": 1.0}},
    },
)
"""


@pytest.fixture
def own_registry():
    """The family registry and the schema as they were, after a test that registers one."""
    from libero_eval import settings_schema
    from libero_eval.policy import families

    families.names()
    registry = dict(families._REGISTRY)
    schema = copy.deepcopy(settings_schema.schema())
    yield families
    families._REGISTRY.clear()
    families._REGISTRY.update(registry)
    settings_schema.schema().clear()
    settings_schema.schema().update(schema)
    settings_schema.clear_caches()


def test_a_family_package_of_ones_own_is_registered_from_policy_family_modules(
    tmp_path, monkeypatch, own_registry
):
    """docs/design.md "Adding a policy family": a module listed in policy.family_modules is
    registered by its FAMILY, with its schema section and its own endpoint."""
    from libero_eval import settings_schema

    (tmp_path / "toyfam.py").write_text(TOY_FAMILY)
    monkeypatch.syspath_prepend(str(tmp_path))
    own_registry.load_config_modules({"policy": {"family_modules": ["toyfam"]}})
    assert set(own_registry.names()) == {"cosmos3", "pi05", "toyfam"}
    assert own_registry.get("toyfam").adapter.__name__ == "ToyAdapter"
    assert "toyfam" in settings_schema.section("policy", "family")["enum"]
    config = {"policy": {"family": "toyfam", "family_modules": ["toyfam"]}}
    settings_schema.validate(config)
    assert config["policy"]["toyfam"] == {"gain": 1.0}
    spec = policy_connection_spec(URL, "toyfam", {})
    assert (spec.request_path, spec.health_path, spec.metadata_path) == ("/act", "/ready", None)
    with pytest.raises(ValueError, match=r"policy.toyfam.gain: 'x' is not of type 'number'"):
        settings_schema.validate({"policy": {"family": "toyfam", "toyfam": {"gain": "x"}}})


def test_a_family_module_that_cannot_be_imported_or_declares_no_family_is_named(
    tmp_path, monkeypatch, own_registry
):
    (tmp_path / "notafamily.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"policy.family_modules: cannot import 'no_such_mod'"):
        own_registry.load_modules(["no_such_mod"])
    with pytest.raises(ValueError, match=r"'notafamily' defines no FAMILY"):
        own_registry.load_modules(["notafamily"])
    with pytest.raises(ValueError, match=r"policy.family_modules: expected a list"):
        own_registry.load_modules("toyfam")
    with pytest.raises(ValueError, match=r"unknown policy.family 'nope'.*policy.family_modules"):
        own_registry.get("nope")
