"""The reference server serves π0.5 by the model's conventions over HTTP and the websocket, and
checks what clients send: the state against the robot's, the images against its own
preprocessing of the raw camera frames (Cosmos3 too)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_pi05_adapter import STATS, adapter, observation

from libero_eval.policy.connection import connect, policy_connection_spec
from libero_eval.policy.families import make_adapter
from libero_eval.policy.http_connection import (
    HttpConnection,
    PolicyRequestRejected,
    PolicyResponseError,
)
from libero_eval.reference.server import serve_in_thread
from libero_eval.reference.settings import ReferenceServerSettings

REPO = Path(__file__).resolve().parents[1]
COSMOS3_STATS = (
    REPO / "src" / "libero_eval" / "data" / "stats" / "libero_native_frame_wise_relative_rot6d.json"
)
HOLD = np.array([0, 0, 0, 0, 0, 0, -1.0])  # the hold policy's action: still, gripper open


@pytest.fixture(scope="module")
def pi05_url():
    settings = ReferenceServerSettings(
        policy="hold", family="pi05", family_settings={"norm_stats_path": STATS}
    )
    with serve_in_thread(settings) as url:
        yield url


def privileged(seed: int = 0):
    """An observation with privileged state: the robot's own state and the raw frames."""
    obs = observation(seed)
    state = {
        "robot": {
            "eef_pos": obs.proprio["robot0_eef_pos"].tolist(),
            "eef_quat": obs.proprio["robot0_eef_quat"].tolist(),
            "gripper_qpos": obs.proprio["robot0_gripper_qpos"].tolist(),
        },
        "camera_frames": {"agentview": obs.agentview, "wrist": obs.wrist},
    }
    return dataclasses.replace(obs, privileged_state=state)


def connection(url: str, **overrides):
    """A connection to ``url`` as the π0.5 settings ``overrides`` describe it."""
    return connect(policy_connection_spec(url, "pi05", {"pi05": overrides}), max_retries=0)


def roundtrip(url: str, obs, **overrides) -> np.ndarray:
    a = adapter(**overrides)
    with connection(url, **overrides) as client:
        a.check_server_metadata(client.metadata())
        assert client.max_batch_size() == 1
        return a.parse_response(client.infer(a.build_request([obs], "r")), 1)


@pytest.mark.parametrize(
    "overrides",
    [
        {"api": "sglang_http"},
        {"api": "sglang_http", "wire_format": "json", "response_format": "raw"},
        {"api": "sglang_websocket"},
        {"api": "openpi_websocket"},
    ],
    ids=["http-msgpack", "http-json-raw", "websocket", "openpi-raw"],
)
def test_the_expert_comes_back_through_pi05_conventions(pi05_url, overrides):
    actions = roundtrip(pi05_url, privileged(), **overrides)
    assert actions.shape == (1, 5, 7)
    np.testing.assert_allclose(actions[0], np.tile(HOLD, (5, 1)), atol=1e-5)


def test_a_client_with_other_statistics_fails_the_state_check(pi05_url, tmp_path):
    stats = json.loads(STATS.read_text())
    stats["norm_stats"]["state"]["q99"][0] += 0.5  # another checkpoint's statistics
    other = tmp_path / "norm_stats.json"
    other.write_text(json.dumps(stats))
    with pytest.raises(PolicyRequestRejected, match="does not match the robot's: channel 0"):
        roundtrip(pi05_url, privileged(), norm_stats_path=str(other))


def test_an_unpadded_state_is_refused(pi05_url):
    with pytest.raises(PolicyRequestRejected, match="zero-pad the normalized state"):
        roundtrip(pi05_url, privileged(), pad_state_to=None)


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda images: images.update(base_0_rgb=images["base_0_rgb"][::-1, ::-1]), "flip"),
        (
            lambda images: images.update(
                base_0_rgb=images["left_wrist_0_rgb"], left_wrist_0_rgb=images["base_0_rgb"]
            ),
            "image check failed for base_0_rgb",
        ),
        (lambda images: images.update(base_0_rgb=images["base_0_rgb"][:200]), "shape"),
    ],
    ids=["missing-flip", "swapped-views", "wrong-padding"],
)
def test_images_unlike_the_models_preprocessing_fail_loudly(pi05_url, tamper, message):
    a = adapter()
    payload = a.build_request([privileged()], "r")
    tamper(payload["input"]["observation"]["images"])
    with (
        HttpConnection(pi05_url, max_retries=0) as client,
        pytest.raises(PolicyRequestRejected, match=message) as excinfo,
    ):
        client.infer(payload)
    assert "raw camera frames" in str(excinfo.value) or "shape" in message


def test_the_websocket_answers_an_error_frame_and_closes(pi05_url):
    a = adapter(api="sglang_websocket")
    payload = a.build_request([privileged()], "r")
    payload["images"]["base_0_rgb"] = payload["images"]["base_0_rgb"][::-1, ::-1]
    with connection(pi05_url, api="sglang_websocket") as client:
        with pytest.raises(PolicyRequestRejected, match="flip"):
            client.infer(payload)
        answer = client.infer(a.build_request([privileged()], "r"))  # a fresh connection
    assert answer["actions"].shape == (50, 32)


def cosmos3_adapter():
    config = yaml.safe_load((REPO / "config" / "libero_spatial_cosmos3_sglang.yaml").read_text())
    return make_adapter("cosmos3", config["policy"])


def test_servers_of_the_other_family_are_refused(pi05_url):
    cosmos3 = cosmos3_adapter()
    with HttpConnection(pi05_url, max_retries=0) as client:
        with pytest.raises(PolicyResponseError, match="serves family 'pi05'"):
            cosmos3.check_server_metadata(client.metadata())
        with pytest.raises(PolicyRequestRejected, match="this is a π0.5 server"):
            client.infer(cosmos3.build_request([privileged()], "r"))
    settings = ReferenceServerSettings(
        policy="hold", family_settings={"action_stats_path": COSMOS3_STATS}
    )
    with (
        serve_in_thread(settings) as url,
        HttpConnection(url, max_retries=0) as client,
        pytest.raises(PolicyResponseError, match="serves family 'cosmos3'"),
    ):
        adapter().check_server_metadata(client.metadata())


def test_cosmos3_images_are_checked_against_the_raw_frames_too():
    cosmos3 = cosmos3_adapter()
    settings = ReferenceServerSettings(
        policy="hold", family_settings={"action_stats_path": COSMOS3_STATS}
    )
    with serve_in_thread(settings) as url, HttpConnection(url, max_retries=0) as client:
        good = cosmos3.build_request([privileged()], "r")
        assert cosmos3.parse_response(client.infer(good), 1).shape == (1, 16, 7)
        bad = cosmos3.build_request([privileged()], "r")
        bad["input"]["input_reference"][0] = bad["input"]["input_reference"][0][::-1, ::-1]
        with pytest.raises(PolicyRequestRejected, match="Cosmos3 LIBERO.*flip"):
            client.infer(bad)


def test_openpis_raw_protocol_checks_the_raw_state_and_images(pi05_url):
    a = adapter(api="openpi_websocket")
    payload = a.build_request([privileged()], "r")
    payload["observation/image"] = payload["observation/image"][::-1, ::-1]
    with connection(pi05_url, api="openpi_websocket") as client:
        assert client.health()  # openpi's /healthz
        with pytest.raises(PolicyRequestRejected, match="flip"):
            client.infer(payload)
        payload = a.build_request([privileged()], "r")
        payload["observation/state"] = payload["observation/state"] + 0.01
        with pytest.raises(PolicyRequestRejected, match="the state does not match the robot's"):
            client.infer(payload)
