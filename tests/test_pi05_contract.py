"""π0.5 wire contract against SGLang 0.5.23's and openpi-client's own code (tests/sglang_side).

What we send passes SGLang's π0.5 request handling and arrives at the model as openpi would
prepare it; what SGLang's handlers send back decodes to LIBERO actions [N, 7].
"""

from __future__ import annotations

import numpy as np
import pytest
import requests
import yaml
from test_pi05_adapter import REPO_ROOT, STATS, adapter, observation

import libero_eval.policy.families.pi05.openpi_transforms as T
from libero_eval.policy import codec
from libero_eval.policy.capacity import PROBE_TASK, synthetic_observation
from libero_eval.policy.families import make_adapter
from libero_eval.policy.http_connection import (
    HttpConnection,
    PolicyRequestRejected,
    PolicyResponseError,
)
from libero_eval.policy.ws_connection import WebsocketConnection


def encoded(payload: dict, wire: str) -> tuple[bytes, str]:
    client = HttpConnection("http://127.0.0.1:1", wire_format=wire)
    body, headers = client.encode(payload)
    return body, headers["Content-Type"]


def expected_prompt(obs, state: np.ndarray) -> str:
    bins = np.digitize(state, bins=np.linspace(-1, 1, 257)[:-1]) - 1
    return f"Task: {obs.task_language}, State: {' '.join(map(str, bins))};\nAction: "


def check_model_input(parsed: dict, obs, a) -> None:
    """SGLang built the model input openpi's transforms would have built."""
    assert parsed["sampling_params"] == "Pi05SamplingParams"
    assert parsed["prompt"] == obs.task_language
    assert (parsed["action_horizon"], parsed["action_dim"], parsed["num_inference_steps"]) == (
        50,
        32,
        10,
    )
    state = a.model_state(obs)
    np.testing.assert_array_equal(np.asarray(parsed["state"], dtype=np.float32)[0], state)
    assert parsed["full_prompt"] == expected_prompt(obs, state)
    ours = T.libero_images(obs.agentview, obs.wrist, 224)
    for key, mask in T.image_masks().items():
        image = parsed["images"][key]
        assert image["mask"] is mask
        assert image["shape"] == [1, 3, 224, 224]
        if mask:  # already 224x224: SGLang only scales to [-1, 1], no second resize
            tensor = np.frombuffer(image["values"], dtype=np.float32).reshape(3, 224, 224)
            expected = ours[key].transpose(2, 0, 1).astype(np.float32) / 255.0 * 2.0 - 1.0
            np.testing.assert_allclose(tensor, expected, atol=1e-6)


def test_what_the_serve_job_sends_before_ready_passes_sglangs_pi05_handling(sglang_side):
    """The capacity probe's requests, and its graph warm-up's (`policy.capacity`): the
    synthetic observation with a LIBERO task's sentence."""
    obs, a = synthetic_observation(256), adapter()
    body, content_type = encoded(a.build_request([obs], "graphs-r0-b16-3"), "msgpack")
    parsed = sglang_side.call("pi05_parse", body=body, content_type=content_type, route="http")
    assert parsed["prompt"] == PROBE_TASK
    check_model_input(parsed, obs, a)


@pytest.mark.parametrize("wire", ["msgpack", "json"])
def test_sglang_http_body_passes_sglangs_pi05_handling(sglang_side, wire):
    obs, a = observation(), adapter(wire_format=wire)
    body, content_type = encoded(a.build_request([obs], "req-7"), wire)
    parsed = sglang_side.call("pi05_parse", body=body, content_type=content_type, route="http")
    assert parsed["request_id"] == "req-7"
    assert parsed["response_format"] == "envelope"
    assert parsed["output_format"] == ("numpy" if wire == "msgpack" else "list")
    check_model_input(parsed, obs, a)


def test_sglang_websocket_frame_passes_sglangs_openpi_endpoint(sglang_side):
    obs, a = observation(1), adapter(api="sglang_websocket")
    frame = codec.pack(a.build_request([obs], "req-8"))
    parsed = sglang_side.call("pi05_parse", body=frame, content_type="msgpack", route="ws")
    assert parsed["output_format"] == "numpy"
    check_model_input(parsed, obs, a)


def http_decode(body: bytes, content_type: str) -> dict:
    response = requests.models.Response()
    response.status_code, response._content = 200, body
    response.headers["content-type"] = content_type
    return HttpConnection("http://127.0.0.1:1")._check_response("POST", "url", response)


@pytest.mark.parametrize(
    ("route", "response_format", "wire"),
    [
        ("http", "envelope", "msgpack"),
        ("http", "envelope", "json"),
        ("http", "raw", "msgpack"),
        ("ws", None, "msgpack"),
    ],
)
def test_sglang_built_answers_decode_to_libero_actions(sglang_side, route, response_format, wire):
    model = np.random.default_rng(3).uniform(-1, 1, (50, 32)).astype(np.float32)
    body = sglang_side.call(
        "pi05_response",
        actions=model.tobytes(),
        shape=[50, 32],
        route=route,
        response_format=response_format or "envelope",
        wire=wire,
    )
    if route == "ws":
        decoded = WebsocketConnection("http://127.0.0.1:1")._decode(body, "answer")
        a = adapter(api="sglang_websocket")
    else:
        content_type = "application/msgpack" if wire == "msgpack" else "application/json"
        decoded = http_decode(body, content_type)
        a = adapter(response_format=response_format, wire_format=wire)
    actions = a.parse_response(decoded, 1)
    assert actions.shape == (1, 5, 7)
    stats = T.load_norm_stats(STATS)
    expected = T.unnormalize(model[:5, :7], stats.actions, "quantile", "openpi")
    np.testing.assert_allclose(actions[0], expected, rtol=1e-6)


def test_sglang_error_frame_and_metadata(sglang_side):
    frame = sglang_side.call("pi05_error_frame", message="Traceback ... ValueError: boom")
    with pytest.raises(PolicyRequestRejected, match="boom"):
        WebsocketConnection("http://127.0.0.1:1")._decode(frame, "answer")
    metadata = sglang_side.call("pi05_metadata")
    assert metadata["capabilities"]["batch_inputs"] is False
    assert metadata["output"]["padded_action_dim"] == 32
    adapter().check_server_metadata(metadata)
    policy = yaml.safe_load(
        (REPO_ROOT / "config" / "libero_spatial_cosmos3_sglang.yaml").read_text()
    )
    cosmos3 = make_adapter("cosmos3", policy["policy"])
    with pytest.raises(PolicyResponseError, match="serves family 'pi05'"):
        cosmos3.check_server_metadata(metadata)


@pytest.mark.parametrize("shape", [(256, 256, 3), (200, 300, 3), (480, 640, 3)])
def test_resize_with_pad_matches_openpi_client(sglang_side, shape):
    image = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    theirs = sglang_side.call("openpi_resize", image=image.tobytes(), shape=list(shape), size=224)
    ours = T.resize_with_pad(image, 224, 224)
    np.testing.assert_array_equal(ours, np.frombuffer(theirs, np.uint8).reshape(224, 224, 3))


def test_openpi_frames_both_ways_with_openpi_clients_msgpack(sglang_side):
    obs, a = observation(2), adapter(api="openpi_websocket")
    request = a.build_request([obs], "r")
    seen = sglang_side.call("openpi_unpack", frame=codec.pack(request))
    assert seen["prompt"] == obs.task_language
    state = seen["observation/state"]
    assert (state["dtype"], state["shape"]) == ("<f8", [8])
    np.testing.assert_array_equal(np.frombuffer(state["data"], "<f8"), a.raw_state(obs))
    for key in ("observation/image", "observation/wrist_image"):
        assert (seen[key]["dtype"], seen[key]["shape"]) == ("|u1", [224, 224, 3])
    libero = np.random.default_rng(4).uniform(-1, 1, (10, 7))
    frame = sglang_side.call("openpi_pack_actions", actions=libero.tobytes(), shape=[10, 7])
    decoded = WebsocketConnection("http://127.0.0.1:1")._decode(frame, "answer")
    np.testing.assert_array_equal(a.parse_response(decoded, 1)[0], libero[:5])


def test_sglang_serve_command_for_pi05_passes_sglangs_own_parser(sglang_side):
    from libero_eval.serve.command import build_command
    from libero_eval.serve.settings import ServerSettings

    settings = ServerSettings.from_dict(
        {
            "backend": "sglang",
            "slot": 0,
            "port": 30001,
            "sglang": {
                "command": ["sglang"],
                "model_path": "lerobot/pi05_libero_finetuned",
                "batching_max_size": 16,
                "batching_delay_ms": 30,
                "pipeline_class_name": "Pi05Pipeline",
            },
        }
    )
    argv = build_command(settings)
    assert argv[:2] == ["sglang", "serve"]
    seen = sglang_side.call("serve_args", argv=argv[2:])
    assert seen["diffusion_backend"]  # `sglang serve` picks the diffusion server, not the LLM one
    assert seen["unknown"] == []
    assert seen["pipeline_config"] == "Pi05PipelineConfig"
    parsed = seen["parsed"]
    assert (parsed["pipeline_class_name"], parsed["batching_max_size"]) == ("Pi05Pipeline", 16)
    assert parsed["batching_delay_ms"] == 30.0
    assert (parsed["host"], parsed["port"], parsed["num_gpus"]) == ("127.0.0.1", 30001, 1)


@pytest.mark.parametrize("name", ["libero_pi05_openpi_sglang.yaml", "libero_pi05_sglang.yaml"])
def test_shipped_pipeline_config_is_read_by_sglangs_own_pi05_config(sglang_side, name):
    """The shipped configs' ``server.sglang.pipeline_config`` reaches SGLang as a file its
    parser accepts, and SGLang's Pi05PipelineConfig takes every field with its value."""
    from libero_eval.serve.command import build_command
    from libero_eval.serve.settings import ServerSettings

    shipped = yaml.safe_load((REPO_ROOT / "config" / name).read_text())["server"]["sglang"]
    settings = ServerSettings.from_dict(
        {"backend": "sglang", "slot": 0, "port": 30001, "sglang": shipped}
    )
    argv = build_command(settings)
    path = argv[argv.index("--pipeline-config-path") + 1]
    seen = sglang_side.call("serve_args", argv=argv[2:])
    assert seen["unknown"] == [] and seen["parsed"]["pipeline_config_path"] == path
    loaded = sglang_side.call("pi05_pipeline_config", path=path)
    assert set(shipped["pipeline_config"]) <= set(loaded["fields"])
    assert loaded["values"] == shipped["pipeline_config"]
