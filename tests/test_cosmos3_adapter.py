"""Cosmos3 adapter: request bodies SGLang 0.5.23 accepts, responses turned into LIBERO actions."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import libero_eval.policy.families.cosmos3.actions as am
from libero_eval.policy import codec
from libero_eval.policy.connection import policy_connection_spec
from libero_eval.policy.families import ADAPTERS, Observation, make_adapter
from libero_eval.policy.families.cosmos3.adapter import Cosmos3Adapter
from libero_eval.policy.http_connection import PolicyResponseError

STATS_PATH = (
    Path(__file__).resolve().parents[1]
    / "src"
    / "libero_eval"
    / "data"
    / "stats"
    / "libero_native_frame_wise_relative_rot6d.json"
)
TASK_A = "pick up the black bowl on the ramekin and place it on the plate"
TASK_B = "pick up the black bowl next to the cookie box and place it on the plate"


def reference_settings(**overrides: Any) -> dict[str, Any]:
    settings = {
        "action_mode": "policy",
        "raw_action_dim": 10,
        "action_dim": 7,
        "num_action_chunks": 16,
        "num_frames": 17,
        "fps": 20,
        "action_fps": 20.0,
        "action_view_point": "ego_view",
        "num_inference_steps": 30,
        "size": "320x192",
        "seed": 1140,
        "domain_name": "libero",
        "guidance_scale": None,
        "action_stats_path": str(STATS_PATH),
        "normalization": "quantile_rot",
        "gripper_mapping": "binary",
        "orthonormalization": "gram_schmidt",
        "transport": "msgpack",
        "response_format": "envelope",
    }
    settings.update(overrides)
    return settings


def observation(task: str, seed: int, state: dict | None = None) -> Observation:
    rng = np.random.default_rng(seed)
    return Observation(
        agentview=rng.integers(0, 256, size=(256, 256, 3), dtype=np.uint8),
        wrist=rng.integers(0, 256, size=(256, 256, 3), dtype=np.uint8),
        task_language=task,
        privileged_state=state,
    )


def sglang_cosmos3_checks(payload: dict[str, Any], batching_max_size: int = 8) -> int:
    """The request checks of SGLang 0.5.23 (entrypoints/action/cosmos3.py,
    build_cosmos3_action_sampling_params, and protocol.py's input handling), transcribed.
    Returns the batch size the server would run."""
    parameters = dict(payload.get("parameters") or {})
    input_block = payload["input"]
    options = {**input_block, **parameters}
    action_mode = str(options.get("action_mode", "policy")).strip().lower()
    if action_mode not in ("policy", "inverse_dynamics"):
        raise ValueError("action_mode")
    action_horizon, num_frames = options.get("action_horizon"), options.get("num_frames")
    if action_horizon is not None:
        if int(action_horizon) <= 0:
            raise ValueError("action_horizon must be a positive integer")
        if num_frames is not None and int(num_frames) != int(action_horizon) + 1:
            raise ValueError("Cosmos3 requires num_frames == action_horizon + 1")
        num_frames = int(action_horizon) + 1
    elif num_frames is None:
        num_frames = 17
    if (int(num_frames) - 1) % 4 != 0:
        raise ValueError("num_frames is not compatible with the temporal VAE")
    images = input_block.get("input_reference")
    images = list(images) if isinstance(images, list | tuple) else [images]
    for image in images:
        if isinstance(image, np.ndarray):
            if image.dtype != np.uint8 or image.ndim not in (2, 3):
                raise ValueError("Cosmos3 observation image arrays must use uint8 dtype")
        elif not (isinstance(image, dict) and "b64_json" in image):
            raise ValueError(f"unsupported image {type(image).__name__}")
    if action_mode == "policy" and not images:
        raise ValueError("Cosmos3 policy input requires an observation image")
    batch_size = len(images)
    if batch_size > batching_max_size:
        raise ValueError("batch size exceeds --batching-max-size")
    if options.get("domain_id") is None and not options.get("domain_name"):
        raise ValueError("Cosmos3 action requests require domain_name or domain_id")
    prompt = input_block.get("prompt")
    if isinstance(prompt, list):
        if not all(isinstance(item, str) for item in prompt):
            raise ValueError("prompt list must contain only strings")
        if len(prompt) != batch_size and not (len(prompt) == 1 and batch_size > 1):
            raise ValueError("Cosmos3 batched action input requires one prompt per image")
    elif not isinstance(prompt, str):
        raise ValueError("Cosmos3 action prompt must be a string or non-empty list")
    runtime = payload.get("runtime") or {}
    if str(runtime.get("response_format", "envelope")) not in ("envelope", "raw"):
        raise ValueError("runtime.response_format must be 'envelope' or 'raw'")
    if str(runtime.get("output_format", "list")) not in ("list", "numpy"):
        raise ValueError("output_format must be 'list' or 'numpy'")
    return batch_size


def envelope_response(chunks: list[np.ndarray], as_lists: bool = False, order=None) -> dict:
    """A response shaped like SGLang's action_generation_response (one entry per input)."""
    data = []
    for index, values in enumerate(chunks):
        data.append(
            {
                "index": index,
                "input_index": index,
                "candidate_index": 0,
                "action": {
                    "type": "continuous",
                    "dtype": "float32",
                    "shape": list(values.shape),
                    "values": values.tolist() if as_lists else values,
                    "action_mode": "policy",
                    "raw_action_dim": 10,
                },
            }
        )
    if order is not None:
        data = [data[i] for i in order]
    return {"id": "act_1", "object": "action.generation", "data": data, "usage": {}}


@pytest.fixture(scope="module")
def adapter() -> Cosmos3Adapter:
    return Cosmos3Adapter(reference_settings())


@pytest.fixture(scope="module")
def stats() -> am.ActionStats:
    return am.load_action_stats(STATS_PATH, "global_raw")


def known_actions(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [
            rng.uniform(-0.5, 0.5, size=(16, 3)),
            rng.uniform(-0.08, 0.08, size=(16, 3)),
            rng.choice([-1.0, 1.0], size=(16, 1)),
        ],
        axis=1,
    )


def padded_model_chunk(actions: np.ndarray, stats: am.ActionStats, width: int = 32) -> np.ndarray:
    chunk = np.random.default_rng(0).uniform(-1, 1, size=(actions.shape[0], width))
    chunk[:, :10] = am.libero_to_model_chunk(actions, stats)
    return chunk.astype(np.float32)


# ------------------------------------------------------------------------------ requests


def test_batched_request_with_one_task_broadcasts_the_prompt(adapter):
    observations = [observation(TASK_A, seed) for seed in range(3)]
    payload = adapter.build_request(observations, request_id="shard0-step16")
    assert sglang_cosmos3_checks(payload) == 3
    assert payload["request_id"] == "shard0-step16"
    assert payload["input"]["prompt"] == am.augment_prompt(TASK_A)
    images = payload["input"]["input_reference"]
    assert len(images) == 3
    for obs, image in zip(observations, images, strict=True):
        assert image.dtype == np.uint8 and image.shape == (192, 320, 3)
        np.testing.assert_array_equal(
            image, am.preprocess_observation_image(obs.agentview, obs.wrist)
        )
    assert payload["runtime"] == {"response_format": "envelope", "output_format": "numpy"}
    assert "privileged_state" not in payload["input"]


def test_every_cosmos3_parameter_is_sent_explicitly(adapter):
    payload = adapter.build_request([observation(TASK_A, 0)], request_id="r")
    assert payload["parameters"] == {
        "action_mode": "policy",
        "num_frames": 17,
        "action_horizon": 16,
        "domain_name": "libero",
        "raw_action_dim": 10,
        "action_fps": 20.0,
        "fps": 20,
        "action_view_point": "ego_view",
        "num_inference_steps": 30,
        "height": 192,
        "width": 320,
        "seed": 1140,
    }
    params = payload["parameters"]
    assert params["num_frames"] == params["action_horizon"] + 1
    assert (params["num_frames"] - 1) % 4 == 0


def test_guidance_scale_is_sent_only_when_configured():
    with_guidance = Cosmos3Adapter(reference_settings(guidance_scale=2))
    payload = with_guidance.build_request([observation(TASK_A, 0)], request_id="r")
    assert payload["parameters"]["guidance_scale"] == 2.0
    settings = reference_settings()
    del settings["guidance_scale"]
    payload = Cosmos3Adapter(settings).build_request([observation(TASK_A, 0)], request_id="r")
    assert "guidance_scale" not in payload["parameters"]


def test_mixed_tasks_get_one_prompt_per_image(adapter):
    observations = [observation(TASK_A, 0), observation(TASK_B, 1)]
    payload = adapter.build_request(observations, request_id="r")
    assert sglang_cosmos3_checks(payload) == 2
    assert payload["input"]["prompt"] == [am.augment_prompt(TASK_A), am.augment_prompt(TASK_B)]
    assert adapter.prompt_key(observations[0]) != adapter.prompt_key(observations[1])
    assert adapter.prompt_key(observations[0]) == adapter.prompt_key(observation(TASK_A, 9))


def test_msgpack_request_carries_raw_image_bytes(adapter):
    payload = adapter.build_request([observation(TASK_A, s) for s in range(4)], request_id="r")
    body = codec.pack(payload)
    assert len(body) < 4 * 192 * 320 * 3 + 4096  # raw pixels plus a small envelope
    decoded = codec.unpack(body)
    assert sglang_cosmos3_checks(decoded) == 4
    for sent, received in zip(
        payload["input"]["input_reference"], decoded["input"]["input_reference"], strict=True
    ):
        np.testing.assert_array_equal(sent, received)


def test_png_base64_transport_sends_lossless_pngs_in_json():
    settings = reference_settings(transport="png_base64")
    adapter = Cosmos3Adapter(settings)
    endpoint = policy_connection_spec("http://h:1", "cosmos3", settings)
    assert endpoint.wire_format == "json"
    observations = [observation(TASK_A, 0), observation(TASK_A, 1)]
    payload = json.loads(json.dumps(adapter.build_request(observations, request_id="r")))
    assert sglang_cosmos3_checks(payload) == 2
    assert payload["runtime"]["output_format"] == "list"
    for obs, reference in zip(observations, payload["input"]["input_reference"], strict=True):
        png = base64.b64decode(reference["b64_json"])
        assert png.startswith(b"\x89PNG")
        pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        np.testing.assert_array_equal(
            pixels, am.preprocess_observation_image(obs.agentview, obs.wrist)
        )


def test_privileged_state_travels_per_observation(adapter):
    states = [{"bowl_pos": np.array([0.1, 0.2, 0.3])}, {"bowl_pos": np.array([0.4, 0.5, 0.6])}]
    observations = [observation(TASK_A, i, state) for i, state in enumerate(states)]
    payload = adapter.build_request(observations, request_id="r")
    assert payload["input"]["privileged_state"] == states
    observations[1].privileged_state = None
    with pytest.raises(ValueError, match="all observations of a batch or on none"):
        adapter.build_request(observations, request_id="r")


def test_the_transcribed_server_checks_reject_bad_bodies(adapter):
    payload = adapter.build_request([observation(TASK_A, 0)] * 2, request_id="r")
    broken = {**payload, "parameters": {**payload["parameters"], "num_frames": 16}}
    with pytest.raises(ValueError, match="num_frames == action_horizon"):
        sglang_cosmos3_checks(broken)
    no_domain = {**payload, "parameters": {**payload["parameters"], "domain_name": None}}
    with pytest.raises(ValueError, match="domain_name or domain_id"):
        sglang_cosmos3_checks(no_domain)
    bad_prompts = {**payload, "input": {**payload["input"], "prompt": ["a", "b", "c"]}}
    with pytest.raises(ValueError, match="one prompt per image"):
        sglang_cosmos3_checks(bad_prompts)
    with pytest.raises(ValueError, match="batching-max-size"):
        sglang_cosmos3_checks(payload, batching_max_size=1)


def test_empty_batch_is_rejected(adapter):
    with pytest.raises(ValueError, match="at least one observation"):
        adapter.build_request([], request_id="r")


# ------------------------------------------------------------------------------ settings


def test_missing_settings_are_named_with_their_config_key():
    settings = reference_settings()
    del settings["domain_name"], settings["seed"]
    with pytest.raises(ValueError, match="policy.cosmos3.seed, policy.cosmos3.domain_name"):
        Cosmos3Adapter(settings)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"num_frames": 16}, r"policy.cosmos3.num_frames must be 4k \+ 1"),
        ({"raw_action_dim": 7}, "policy.cosmos3.raw_action_dim must be 10"),
        ({"action_dim": 10}, "policy.cosmos3.action_dim must be 7"),
        ({"num_action_chunks": 0}, "policy.cosmos3.num_action_chunks: 0 is less than the minimum"),
        ({"fps": 20.5}, "policy.cosmos3.fps: 20.5 is not of type 'integer'"),
        ({"seed": True}, "policy.cosmos3.seed: True is not of type 'integer'"),
        ({"seed": -1}, "policy.cosmos3.seed: -1 is less than the minimum of 0"),
        ({"action_fps": "fast"}, "policy.cosmos3.action_fps: 'fast' is not of type 'number'"),
        ({"action_fps": float("inf")}, "policy.cosmos3.action_fps must be a finite number"),
        ({"size": "320-192"}, "policy.cosmos3.size: '320-192' does not match"),
        (
            {"action_mode": "inverse_dynamics"},
            r"policy.cosmos3.action_mode: 'inverse_dynamics' is not one of \['policy'\]",
        ),
        ({"normalization": "mean_std"}, "policy.cosmos3.normalization: 'mean_std' is not one of"),
        ({"gripper_mapping": "sign"}, "policy.cosmos3.gripper_mapping: 'sign' is not one of"),
        ({"orthonormalization": "qr"}, "policy.cosmos3.orthonormalization: 'qr' is not one of"),
        ({"transport": "grpc"}, "policy.cosmos3.transport: 'grpc' is not one of"),
        ({"response_format": "json"}, "policy.cosmos3.response_format: 'json' is not one of"),
        ({"guidance_scale": float("nan")}, "policy.cosmos3.guidance_scale must be a finite number"),
        ({"domain_name": ""}, "policy.cosmos3.domain_name: '' "),
    ],
)
def test_bad_settings_are_rejected_with_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        Cosmos3Adapter(reference_settings(**override))


def test_stats_block_follows_normalization_and_missing_files_are_named(tmp_path):
    assert Cosmos3Adapter(reference_settings()).stats.block == "global_raw"
    assert Cosmos3Adapter(reference_settings(normalization="quantile")).stats.block == "global"
    missing = tmp_path / "absent.json"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        Cosmos3Adapter(reference_settings(action_stats_path=str(missing)))


def test_registry_builds_adapters_and_lists_known_families():
    assert ADAPTERS["cosmos3"] is Cosmos3Adapter
    assert isinstance(make_adapter("cosmos3", reference_settings()), Cosmos3Adapter)
    with pytest.raises(ValueError, match=r"unknown policy.family 'pi0'.*\['cosmos3', 'pi05'\]"):
        make_adapter("pi0", {})


# ------------------------------------------------------------------------------ responses


def test_envelope_response_with_padded_actions_becomes_libero_actions(adapter, stats):
    expected = [known_actions(seed) for seed in range(3)]
    response = envelope_response([padded_model_chunk(a, stats) for a in expected])
    result = adapter.parse_response(response, batch_size=3)
    assert result.shape == (3, 16, 7) and result.dtype == np.float64
    np.testing.assert_allclose(result, np.stack(expected), atol=2e-5)


def test_envelope_entries_are_ordered_by_input_index(adapter, stats):
    expected = [known_actions(seed) for seed in range(3)]
    response = envelope_response(
        [padded_model_chunk(a, stats) for a in expected], as_lists=True, order=[2, 0, 1]
    )
    result = adapter.parse_response(response, batch_size=3)
    np.testing.assert_allclose(result, np.stack(expected), atol=2e-5)


def test_envelope_after_a_msgpack_round_trip(adapter, stats):
    expected = known_actions(5)
    body = codec.pack(envelope_response([padded_model_chunk(expected, stats)]))
    result = adapter.parse_response(codec.unpack(body), batch_size=1)
    np.testing.assert_allclose(result[0], expected, atol=2e-5)


def test_raw_response_form(stats):
    adapter = Cosmos3Adapter(reference_settings(response_format="raw"))
    expected = np.stack([known_actions(seed) for seed in range(2)])
    raw = np.stack([padded_model_chunk(a, stats) for a in expected])
    np.testing.assert_allclose(
        adapter.parse_response({"actions": raw}, batch_size=2), expected, atol=2e-5
    )
    single = adapter.parse_response({"actions": raw[0].tolist()}, batch_size=1)
    np.testing.assert_allclose(single[0], expected[0], atol=2e-5)
    with pytest.raises(PolicyResponseError, match=r"\[B=3, H, D\].*\(2, 16, 32\)"):
        adapter.parse_response({"actions": raw}, batch_size=3)


def test_one_entry_holding_the_whole_batch_is_accepted(adapter, stats):
    expected = np.stack([known_actions(seed) for seed in range(2)])
    values = np.stack([padded_model_chunk(a, stats) for a in expected])
    response = {"data": [{"index": 0, "action": {"values": values}}]}
    np.testing.assert_allclose(adapter.parse_response(response, 2), expected, atol=2e-5)


def test_shorter_horizons_are_padded_and_longer_truncated(adapter, stats):
    expected = known_actions(7)
    short = adapter.parse_response(envelope_response([padded_model_chunk(expected[:4], stats)]), 1)[
        0
    ]
    np.testing.assert_allclose(short[:4], expected[:4], atol=2e-5)
    np.testing.assert_allclose(short[4:], np.repeat(short[3:4], 12, axis=0))
    long = np.concatenate([padded_model_chunk(expected, stats)] * 2)
    np.testing.assert_allclose(
        adapter.parse_response(envelope_response([long]), 1)[0], expected, atol=2e-5
    )


def test_wrong_number_of_entries_is_a_clear_error(adapter, stats):
    response = envelope_response([padded_model_chunk(known_actions(s), stats) for s in range(2)])
    with pytest.raises(PolicyResponseError, match="2 action entries, expected 3"):
        adapter.parse_response(response, batch_size=3)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ({"object": "error"}, r"neither 'data' \(envelope\) nor 'actions' \(raw\)"),
        ({"data": []}, "non-empty list"),
        ({"data": [{"index": 0}]}, r"data\[0\] has no 'action.values'"),
        ({"data": [{"action": {"values": "abc"}}]}, "not a numeric array"),
        ({"data": [{"action": {"values": np.zeros((1, 1, 16, 32))}}]}, r"must be \[H, D\]"),
        ({"data": [{"action": {"values": np.zeros((16, 8))}}]}, r"D >= 10"),
        ({"data": [{"action": {"values": np.full((16, 10), np.nan)}}]}, "non-finite"),
        (
            {"data": [{"action": {"values": np.zeros((16, 10)), "raw_action_dim": 7}}]},
            "raw_action_dim is 7",
        ),
        ({"data": [{"input_index": 3, "action": {"values": np.zeros((16, 10))}}]}, "0..0"),
    ],
)
def test_malformed_responses_raise_policy_response_error(adapter, response, message):
    with pytest.raises(PolicyResponseError, match=message):
        adapter.parse_response(response, batch_size=1)
