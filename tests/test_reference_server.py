"""The reference policy server speaks SGLang's Cosmos3 action API over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np
import pytest
import requests
from PIL import Image

from libero_eval import package_data
from libero_eval.policy import codec
from libero_eval.reference import policies
from libero_eval.reference import server as reference_server
from libero_eval.reference.policies import (
    HoldPolicy,
    PolicyItem,
    ServerPolicy,
    make_server_policy,
)
from libero_eval.reference.server import serve_in_thread
from libero_eval.reference.settings import ReferenceServerSettings

STATS_PATH = package_data.path("stats/libero_native_frame_wise_relative_rot6d.json")
GENERATIONS = "/v1/actions/generations"
PADDED_DIM = 12
MSGPACK = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
RNG = np.random.default_rng(7)
IMAGE = RNG.integers(0, 256, size=(8, 16, 3), dtype=np.uint8)


COSMOS3_FIELDS = ("action_stats_path", "normalization", "padded_action_dim")


def settings(**overrides: Any) -> ReferenceServerSettings:
    """The server's settings, Cosmos3's own (its fields of server.reference) among them."""
    values: dict[str, Any] = {
        "action_stats_path": STATS_PATH,
        "padded_action_dim": PADDED_DIM,
        "policy": "hold",  # the schema's default, scripted, needs privileged state
    }
    values.update(overrides)
    own = {key: values.pop(key) for key in COSMOS3_FIELDS if key in values}
    return ReferenceServerSettings(**values, family_settings=own)


@pytest.fixture(scope="module")
def url():
    with serve_in_thread(settings()) as base_url:
        yield base_url


def json_request(batch: int = 1, **parameters: Any) -> dict[str, Any]:
    """A valid JSON request like our client sends (images as nested pixel lists)."""
    return {
        "request_id": "req-test",
        "input": {
            "prompt": "put the bowl on the plate.",
            "input_reference": [IMAGE.tolist()] * batch,
        },
        "parameters": {
            "action_mode": "policy",
            "num_frames": 17,
            "domain_name": "libero",
            "raw_action_dim": 10,
            "seed": 1140,
            "num_inference_steps": 30,
            **parameters,
        },
        "runtime": {"response_format": "envelope", "output_format": "list"},
    }


def msgpack_request(batch: int = 1, **parameters: Any) -> dict[str, Any]:
    body = json_request(batch, **parameters)
    body["input"]["input_reference"] = np.stack([IMAGE] * batch)
    body["runtime"]["output_format"] = "numpy"
    return body


def post_json(url: str, body: Any) -> requests.Response:
    return requests.post(url + GENERATIONS, json=body, timeout=10)


def post_msgpack(url: str, body: Any) -> requests.Response:
    return requests.post(url + GENERATIONS, data=codec.pack(body), headers=MSGPACK, timeout=10)


def denormalize(values: np.ndarray) -> np.ndarray:
    """quantile_rot de-normalization written out from the stats file, independent of our code."""
    block = json.loads(STATS_PATH.read_text())["global_raw"]
    q01, q99 = np.array(block["q01"]), np.array(block["q99"])
    return (np.asarray(values, dtype=np.float64)[..., :10] + 1) / 2 * (q99 - q01) + q01


def assert_hold_chunk(values: Any) -> None:
    values = np.asarray(values)
    assert values.shape == (16, PADDED_DIM)
    physical = denormalize(values)
    np.testing.assert_allclose(physical[:, 0:3], 0.0, atol=1e-6)  # dxyz: stay put
    identity_rot6d = [1, 0, 0, 0, 1, 0]  # first two columns of the identity matrix
    np.testing.assert_allclose(physical[:, 3:9], np.tile(identity_rot6d, (16, 1)), atol=1e-6)
    np.testing.assert_allclose(physical[:, 9], 1.0, atol=1e-6)  # gripper unit 1 = open
    np.testing.assert_array_equal(values[:, 10:], 0.0)  # zero padding


# --- Health and metadata --------------------------------------------------------------------


def test_health_answers_ok(url):
    response = requests.get(url + "/health", timeout=5)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_metadata_has_cosmos3_action_metadata_structure(url):
    metadata = requests.get(url + "/v1/actions/metadata", timeout=5).json()
    assert metadata["object"] == "action.metadata"
    assert metadata["model"] == "reference-hold"
    assert metadata["policy_family"] == "cosmos3"
    assert metadata["output"] == {
        "action_type": "continuous",
        "action_horizon": 16,
        "action_dim": None,
        "padded_action_dim": PADDED_DIM,
        "dtype": "float32",
    }
    assert metadata["capabilities"]["max_batch_size"] == 8
    assert metadata["capabilities"]["batch_inputs"] is True
    assert metadata["defaults"]["action_horizon"] == 16
    assert set(metadata) == {
        "object",
        "model",
        "model_path",
        "policy_family",
        "input",
        "output",
        "runtime",
        "defaults",
        "capabilities",
    }


class SlowToBuildPolicy(HoldPolicy):
    """Blocks its constructor until the test releases it."""

    name = "slow-to-build"
    release = threading.Event()

    def __init__(self) -> None:
        assert self.release.wait(10)


def test_health_is_503_until_the_policy_is_built(monkeypatch):
    monkeypatch.setitem(policies.SERVER_POLICIES, SlowToBuildPolicy.name, SlowToBuildPolicy)
    SlowToBuildPolicy.release.clear()
    with serve_in_thread(settings(policy=SlowToBuildPolicy.name), wait_ready=False) as base:
        response = requests.get(base + "/health", timeout=5)
        assert response.status_code == 503
        assert response.json()["status"] == "starting"
        assert post_json(base, json_request()).status_code == 503
        SlowToBuildPolicy.release.set()
        deadline = time.monotonic() + 5
        while requests.get(base + "/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "server never became healthy"
            time.sleep(0.02)
        assert post_json(base, json_request()).status_code == 200


def test_a_start_up_delay_keeps_health_503_then_logs_its_end(caplog):
    """server.reference.startup_delay_s models a slow start: no answer but 503 meanwhile."""
    with serve_in_thread(settings(startup_delay_s=3600.0), wait_ready=False) as base:
        response = requests.get(base + "/health", timeout=5)
        assert response.status_code == 503 and response.json()["status"] == "starting"
    caplog.set_level("INFO", logger="libero_eval.reference.server")
    with serve_in_thread(settings(startup_delay_s=0.2), timeout_s=60) as base:  # until ready
        assert requests.get(base + "/health", timeout=5).status_code == 200
    assert "start-up delay: 0.2 s (server.reference.startup_delay_s)" in caplog.text


# --- Successful generations -----------------------------------------------------------------


def test_json_envelope_has_sglang_structure_and_a_hold_chunk_per_input(url):
    response = post_json(url, json_request(batch=3))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["id"] == "req-test"
    assert body["object"] == "action.generation"
    assert body["model"] == "reference-hold"
    assert body["usage"] == {
        "batch_size": 3,
        "action_horizon": 16,
        "action_dim": PADDED_DIM,
        "denoise_steps": 30,
        "prefix_cache_hit": False,
    }
    assert [item["input_index"] for item in body["data"]] == [0, 1, 2]
    for index, item in enumerate(body["data"]):
        assert item["index"] == index and item["candidate_index"] == 0
        action = item["action"]
        assert action["type"] == "continuous" and action["dtype"] == "float32"
        assert action["shape"] == [16, PADDED_DIM]
        assert (action["action_mode"], action["domain_id"], action["raw_action_dim"]) == (
            "policy",
            5,
            10,
        )
        assert isinstance(action["values"], list)
        assert_hold_chunk(action["values"])


def test_msgpack_envelope_carries_float32_numpy_values(url):
    response = post_msgpack(url, msgpack_request(batch=2))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/msgpack"
    body = codec.unpack(response.content)
    assert body["usage"]["batch_size"] == 2
    for item in body["data"]:
        values = item["action"]["values"]
        assert isinstance(values, np.ndarray) and values.dtype == np.float32
        assert_hold_chunk(values)


def test_json_request_with_msgpack_accept_gets_msgpack(url):
    response = requests.post(
        url + GENERATIONS,
        json=json_request(),
        headers={"Accept": "application/msgpack"},
        timeout=10,
    )
    assert response.status_code == 200
    assert isinstance(codec.unpack(response.content)["data"][0]["action"]["values"], np.ndarray)


def test_raw_response_is_the_model_output_batch_first(url):
    body = msgpack_request(batch=2)
    body["runtime"]["response_format"] = "raw"
    raw = codec.unpack(post_msgpack(url, body).content)
    assert set(raw) == {"request_id", "actions", "action_mode", "domain_id", "raw_action_dim",
                        "parameters"}  # fmt: skip
    assert raw["actions"].shape == (2, 16, PADDED_DIM)
    assert raw["parameters"] == {"num_inference_steps": 30, "num_frames": 17}
    for chunk in raw["actions"]:
        assert_hold_chunk(chunk)


def test_raw_response_for_one_input_is_squeezed_to_h_d_like_sglang(url):
    body = json_request(batch=1)
    body["runtime"]["response_format"] = "raw"
    raw = post_json(url, body).json()
    assert np.asarray(raw["actions"]).shape == (16, PADDED_DIM)
    assert_hold_chunk(raw["actions"])


def test_missing_request_id_gets_a_generated_one(url):
    body = json_request()
    del body["request_id"]
    generated = post_json(url, body).json()["id"]
    assert isinstance(generated, str) and len(generated) >= 16


def test_action_horizon_sets_the_chunk_length(url):
    body = json_request(action_horizon=8)
    del body["parameters"]["num_frames"]
    data = post_json(url, body).json()["data"][0]["action"]
    assert data["shape"] == [8, PADDED_DIM]


# --- What the policy sees -------------------------------------------------------------------


class RecordingPolicy(ServerPolicy):
    """Holds, and records the items it was given."""

    name = "recording"
    seen: ClassVar[list[list[PolicyItem]]] = []

    def act(self, items: list[PolicyItem], action_horizon: int) -> list[np.ndarray]:
        self.seen.append(items)
        return HoldPolicy().act(items, action_horizon)


@pytest.fixture(scope="module")
def recording_url():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(policies.SERVER_POLICIES, RecordingPolicy.name, RecordingPolicy)
        with serve_in_thread(settings(policy=RecordingPolicy.name)) as base_url:
            yield base_url


def png_base64(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def items_for(url: str, input_payload: dict[str, Any], use_msgpack: bool = False, **params):
    body = json_request(**params)
    body["input"] = input_payload
    RecordingPolicy.seen.clear()
    response = (post_msgpack if use_msgpack else post_json)(url, body)
    assert response.status_code == 200, response.text
    (items,) = RecordingPolicy.seen
    return items


@pytest.mark.parametrize(
    "image_value, use_msgpack",
    [
        ([IMAGE.tolist()], False),
        (IMAGE, True),
        (IMAGE[None], True),
        ([IMAGE], True),
        ({"b64_json": png_base64(IMAGE)}, False),
        ({"b64_json": "data:image/png;base64," + png_base64(IMAGE)}, False),
        ({"values": IMAGE.ravel().tolist(), "dtype": "uint8", "shape": list(IMAGE.shape)}, False),
    ],
    ids=["nested-lists", "array", "BHWC-array", "list-of-arrays", "b64-png", "data-uri", "tensor"],
)
def test_every_sglang_image_encoding_reaches_the_policy_as_the_same_pixels(
    recording_url, image_value, use_msgpack
):
    items = items_for(recording_url, {"prompt": "p", "input_reference": image_value}, use_msgpack)
    assert len(items) == 1
    assert items[0].image.dtype == np.uint8
    np.testing.assert_array_equal(items[0].image, IMAGE)


@pytest.mark.parametrize("field", ["image", "image_path", "images"])
def test_other_image_fields_are_read_like_sglang(recording_url, field):
    value = {"agentview": IMAGE.tolist()} if field == "images" else [IMAGE.tolist()]
    items = items_for(recording_url, {"prompt": "p", field: value})
    np.testing.assert_array_equal(items[0].image, IMAGE)


def test_image_path_reads_a_local_file_like_sglang(recording_url, tmp_path):
    path = tmp_path / "frame.png"
    Image.fromarray(IMAGE).save(path)
    items = items_for(recording_url, {"prompt": "p", "image_path": str(path)})
    np.testing.assert_array_equal(items[0].image, IMAGE)


def test_grayscale_images_become_rgb(recording_url):
    gray = IMAGE[..., 0]
    items = items_for(recording_url, {"prompt": "p", "input_reference": gray}, use_msgpack=True)
    assert items[0].image.shape == (8, 16, 3)
    np.testing.assert_array_equal(items[0].image[..., 2], gray)


def test_prompts_seed_and_privileged_state_reach_the_policy(recording_url):
    states = [{"bowl_pos": [0.1, 0.2, 0.3]}, None]
    items = items_for(
        recording_url,
        {
            "prompt": ["first task.", "second task."],
            "input_reference": [IMAGE.tolist(), IMAGE.tolist()],
            "privileged_state": states,
        },
    )
    assert [item.prompt for item in items] == ["first task.", "second task."]
    assert [item.privileged_state for item in items] == states
    assert [item.seed for item in items] == [1140, 1140]


def test_one_prompt_is_broadcast_and_task_wins_over_prompt(recording_url):
    items = items_for(
        recording_url,
        {"task": "the task.", "prompt": "ignored", "input_reference": [IMAGE.tolist()] * 3},
    )
    assert [item.prompt for item in items] == ["the task."] * 3


# --- Rejections -----------------------------------------------------------------------------


def with_parameters(**parameters: Any) -> dict[str, Any]:
    body = json_request()
    body["parameters"].update(parameters)
    for name, value in parameters.items():
        if value is None:
            del body["parameters"][name]
    return body


def with_input(**fields: Any) -> dict[str, Any]:
    body = json_request()
    body["input"].update(fields)
    for name, value in fields.items():
        if value is None:
            del body["input"][name]
    return body


REJECTIONS = {
    "num-frames-not-horizon-plus-1": (
        with_parameters(action_horizon=16, num_frames=18),
        "Cosmos3 requires num_frames == action_horizon + 1, got num_frames=18, action_horizon=16",
    ),
    "horizon-not-divisible-by-4": (
        with_parameters(num_frames=16),
        "Cosmos3 action_horizon must be divisible by 4",
    ),
    "missing-image": (
        with_input(input_reference=None),
        "Cosmos3 policy input requires an observation image",
    ),
    "batch-over-max": (
        with_input(input_reference=[IMAGE.tolist()] * 9),
        "Cosmos3 action batch size 9 exceeds --batching-max-size=8",
    ),
    "missing-domain": (
        with_parameters(domain_name=None),
        "Cosmos3 action requests require domain_name or domain_id",
    ),
    "domain-id-without-raw-action-dim": (
        with_parameters(domain_name=None, domain_id=5, raw_action_dim=None),
        "raw_action_dim is required when only domain_id is provided",
    ),
    "libero-without-raw-action-dim": (
        with_parameters(raw_action_dim=None),
        "No raw action dim for Cosmos3 embodiment 'libero'",
    ),
    "unknown-domain": (
        with_parameters(domain_name="mars_rover"),
        "Unknown action domain name 'mars_rover'",
    ),
    "prompt-count-mismatch": (
        with_input(prompt=["a", "b"], input_reference=[IMAGE.tolist()] * 3),
        "requires one prompt per image, got 2 prompt(s) and 3 image(s)",
    ),
    "non-string-prompt": (
        with_input(prompt=["a", 3], input_reference=[IMAGE.tolist()] * 2),
        "Cosmos3 action prompt list must contain only strings",
    ),
    "empty-prompt-list": (
        with_input(prompt=[]),
        "Cosmos3 action prompt must be a string or non-empty list",
    ),
    "bad-response-format": (
        {**json_request(), "runtime": {"response_format": "table"}},
        "runtime.response_format must be 'envelope' or 'raw'",
    ),
    "pixel-values-beyond-uint8": (
        with_input(input_reference=[(IMAGE.astype(np.int64) + 100).tolist()]),
        "Cosmos3 observation image arrays must use uint8 dtype",
    ),
    "forward-dynamics": (
        with_parameters(action_mode="forward_dynamics"),
        "Cosmos3 forward_dynamics produces video; use /v1/videos instead",
    ),
    "unknown-action-mode": (
        with_parameters(action_mode="dream"),
        "Cosmos3 action endpoint supports action_mode='policy' or 'inverse_dynamics'",
    ),
    "inverse-dynamics-without-video": (
        with_parameters(action_mode="inverse_dynamics"),
        "Cosmos3 inverse_dynamics input requires an observation video",
    ),
    "raw-action-dim-out-of-range": (
        with_parameters(raw_action_dim=PADDED_DIM + 1),
        f"raw_action_dim must be in [1, {PADDED_DIM}], got {PADDED_DIM + 1}",
    ),
    "raw-action-dim-not-libero": (
        with_parameters(raw_action_dim=7),
        "send raw_action_dim=10, got 7",
    ),
    "non-numeric-parameter": (
        with_parameters(seed="lucky"),
        "parameters.seed must be an integer, got 'lucky'",
    ),
    "unwrapped-nested-list-image": (
        with_input(input_reference=IMAGE.tolist()),
        "wrap a single nested-list image in a list",
    ),
    "bad-base64": (
        with_input(input_reference={"b64_json": "not base64 at all!"}),
        "image b64_json is not a base64-encoded PNG or JPEG",
    ),
    "privileged-state-count": (
        with_input(privileged_state=[{}, {}]),
        "input.privileged_state must be a list of 1 objects",
    ),
    "body-is-a-list": ([json_request()], "request body must be an object"),
    "parameters-not-an-object": (
        {**json_request(), "parameters": [1, 2]},
        "parameters must be an object, got list",
    ),
}


@pytest.mark.parametrize("body, message", REJECTIONS.values(), ids=REJECTIONS.keys())
def test_invalid_json_requests_are_rejected_with_400_and_sglangs_message(url, body, message):
    response = post_json(url, body)
    assert response.status_code == 400
    assert message in response.json()["detail"]


MSGPACK_REJECTIONS = {
    "float32-image": (
        {"input_reference": IMAGE.astype(np.float32)},
        "Cosmos3 observation image arrays must use uint8 dtype",
    ),
    "5-d-image": (
        {"input_reference": [IMAGE[None, None]]},
        "Cosmos3 observation image arrays must have shape [H, W] or [H, W, C], "
        "got (1, 1, 8, 16, 3)",
    ),
    "empty-image": (
        {"input_reference": np.zeros((0, 4, 3), dtype=np.uint8)},
        "input image 0 is empty (shape (0, 4, 3))",
    ),
    "missing-image-file": (
        {"input_reference": None, "image_path": "/nonexistent/frame.png"},
        "input image 0 is the path '/nonexistent/frame.png', which is not a file",
    ),
    "two-image-fields-in-images": (
        {"input_reference": None, "images": {"a": IMAGE, "b": IMAGE}},
        "Cosmos3 action input accepts one image field",
    ),
}


@pytest.mark.parametrize("fields, message", MSGPACK_REJECTIONS.values(), ids=MSGPACK_REJECTIONS)
def test_invalid_msgpack_images_are_rejected_with_400(url, fields, message):
    body = msgpack_request()
    body["input"].update(fields)
    body["input"] = {name: value for name, value in body["input"].items() if value is not None}
    response = post_msgpack(url, body)
    assert response.status_code == 400
    assert message in response.json()["detail"]


@pytest.mark.parametrize(
    "data, content_type, message",
    [
        (b"\xc1\x00garbage", "application/msgpack", "request body is not valid msgpack"),
        (b"", "application/msgpack", "request body is not valid msgpack"),
        (b"{not json", "application/json", "request body is not valid JSON"),
        (b"[1, 2", "text/plain", "request body is not valid JSON"),
    ],
    ids=["garbage-msgpack", "empty-msgpack", "broken-json", "broken-json-no-type"],
)
def test_undecodable_bodies_are_rejected_with_400(url, data, content_type, message):
    response = requests.post(
        url + GENERATIONS, data=data, headers={"Content-Type": content_type}, timeout=5
    )
    assert response.status_code == 400
    assert message in response.json()["detail"]


def test_rejections_are_counted_in_stats():
    with serve_in_thread(settings()) as base:
        post_json(base, [])
        post_json(base, json_request())
        stats = requests.get(base + "/v1/stats", timeout=5).json()
    assert (stats["rejected"], stats["requests"], stats["items"]) == (1, 1, 1)


# --- Latency model and stats ----------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_url():
    with serve_in_thread(settings(latency_fixed_s=0.2, latency_per_item_s=0.05)) as base_url:
        yield base_url


def timed_post(url: str, batch: int) -> float:
    started = time.perf_counter()
    response = post_msgpack(url, msgpack_request(batch=batch))
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def test_a_request_takes_at_least_the_modelled_latency(slow_url):
    assert timed_post(slow_url, batch=1) >= 0.2 + 0.05
    assert timed_post(slow_url, batch=4) >= 0.2 + 4 * 0.05


def test_concurrent_requests_are_served_one_at_a_time_and_busy_time_is_counted(monkeypatch):
    """The first request's computation is held until the second has arrived and has waited
    0.2 s for the slot (events, not timing): the second is computed only after the first,
    and its wait and both latencies are counted."""
    apps, create_app = [], reference_server.create_app

    def capture_app(server_settings: ReferenceServerSettings):
        apps.append(create_app(server_settings))
        return apps[-1]

    monkeypatch.setattr(reference_server, "create_app", capture_app)
    serving, second_arrived, release = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []
    with serve_in_thread(settings(latency_fixed_s=0.2, latency_per_item_s=0.05)) as base:
        slot = apps[0].state.reference_server.slot
        real_run, real_offload = slot.run, slot._offload
        arrivals = []

        async def run(compute, items):
            arrivals.append(items)
            if len(arrivals) == 2:
                second_arrived.set()  # it goes on to the slot's lock without yielding
            return await real_run(compute, items)

        async def offload(compute):
            number = len([event for event in order if event.startswith("start")]) + 1
            order.append(f"start {number}")
            if number == 1:
                serving.set()
                while not release.is_set():
                    await asyncio.sleep(0.005)
            value = await real_offload(compute)
            order.append(f"end {number}")
            return value

        monkeypatch.setattr(slot, "run", run)
        monkeypatch.setattr(slot, "_offload", offload)
        before = requests.get(base + "/v1/stats", timeout=5).json()
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as pool:
            first = pool.submit(timed_post, base, 1)
            assert serving.wait(60)
            second = pool.submit(timed_post, base, 1)
            assert second_arrived.wait(60)
            time.sleep(0.2)  # a known least wait of the second for the slot, not a race
            release.set()
            durations = [first.result(), second.result()]
        elapsed = time.perf_counter() - started
        after = requests.get(base + "/v1/stats", timeout=5).json()
    assert order == ["start 1", "end 1", "start 2", "end 2"]  # one at a time
    assert durations[1] >= 0.2 + 0.25  # its wait for the slot, then its own latency
    assert after["requests"] - before["requests"] == 2
    assert after["items"] - before["items"] == 2
    busy = after["busy_s"] - before["busy_s"]
    assert 2 * 0.25 <= busy <= elapsed
    assert after["queue_wait_s"] - before["queue_wait_s"] >= 0.2
    assert after["uptime_s"] >= busy


def test_idle_server_accumulates_uptime_but_no_busy_time(slow_url):
    before = requests.get(slow_url + "/v1/stats", timeout=5).json()
    time.sleep(0.1)
    after = requests.get(slow_url + "/v1/stats", timeout=5).json()
    assert after["busy_s"] == before["busy_s"]
    assert after["uptime_s"] - before["uptime_s"] >= 0.1


# --- Policies and settings ------------------------------------------------------------------


def test_hold_policy_keeps_the_arm_still_with_the_gripper_open():
    item = PolicyItem(image=IMAGE, prompt="p")
    (chunk,) = make_server_policy("hold").act([item], 16)
    assert chunk.shape == (16, 7)
    np.testing.assert_array_equal(chunk[:, :6], 0.0)
    np.testing.assert_array_equal(chunk[:, 6], -1.0)


def test_unknown_policy_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown server policy 'nope'.*'hold'"):
        make_server_policy("nope")
    with pytest.raises(ValueError, match="unknown server policy 'nope'"):
        serve_in_thread(settings(policy="nope")).__enter__()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"padded_action_dim": 7},
            "server.reference.padded_action_dim: 7 is less than the minimum",
        ),
        ({"max_batch_size": 0}, "server.reference.max_batch_size: 0 is less than the minimum"),
        ({"latency_fixed_s": -1.0}, "server.reference.latency_fixed_s: -1.0 is less than"),
        ({"normalization": "zscore"}, "server.reference.normalization: 'zscore' is not one of"),
    ],
)
def test_bad_settings_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        settings(**overrides)


def test_a_setting_the_family_does_not_have_is_named_with_those_it_has():
    with pytest.raises(ValueError, match=r"\['nope'\] are not settings of family 'cosmos3'.*"):
        ReferenceServerSettings(family="cosmos3", family_settings={"nope": 1})
    with pytest.raises(ValueError, match="unknown policy.family 'nope'"):
        ReferenceServerSettings(family="nope")


# --- CLI ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "libero_eval.reference.server", *args]


def test_cli_serves_health_and_logs_one_line_per_request(tmp_path):
    port = free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            cli(
                *("--port", str(port), "--policy", "hold", "--family", "cosmos3"),
                "--family-settings",
                json.dumps(
                    {
                        "action_stats_path": str(STATS_PATH),
                        "normalization": "quantile_rot",
                        "padded_action_dim": 10,
                    }
                ),
                *("--max-batch-size", "8", "--latency-fixed-s", "0.0"),
                *("--latency-per-item-s", "0.0", "--model-name", "reference-hold"),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, log_path.read_text()
            try:
                if requests.get(base + "/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        body = copy.deepcopy(json_request(batch=2))
        body["request_id"] = "cli-request"
        response = post_json(base, body)
        assert response.status_code == 200
        assert response.json()["data"][0]["action"]["shape"] == [16, 10]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    request_lines = [line for line in log_path.read_text().splitlines() if "cli-request" in line]
    assert len(request_lines) == 1
    assert "batch=2" in request_lines[0] and "latency=" in request_lines[0]


def test_cli_rejects_a_missing_stats_file_naming_it(tmp_path):
    missing = tmp_path / "nope.json"
    result = subprocess.run(
        cli(
            *("--port", str(free_port())),
            *("--family-settings", json.dumps({"action_stats_path": str(missing)})),
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert str(missing) in result.stderr
