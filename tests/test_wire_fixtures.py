"""Our reference server agrees with SGLang 0.5.23's wire format (tests/fixtures/sglang)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from libero_eval import package_data
from libero_eval.policy import codec
from libero_eval.reference.server import serve_in_thread
from libero_eval.reference.settings import ReferenceServerSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "sglang"
STATS_PATH = package_data.path("stats/libero_native_frame_wise_relative_rot6d.json")
GENERATIONS = "/v1/actions/generations"
ERROR_FILES = sorted((FIXTURES / "errors").glob("*.json"))
REQUEST_FILES = ["envelope_request.json", "raw_request.json"]


def load(name: str | Path) -> Any:
    return json.loads((FIXTURES / name).read_text())


def structure(value: Any) -> Any:
    """The shape of a JSON document: keys, list lengths and scalar types, not the values."""
    if isinstance(value, dict):
        return {key: structure(item) for key, item in value.items()}
    if isinstance(value, list):
        return [structure(item) for item in value]
    return type(value).__name__


@pytest.fixture(scope="module")
def url():
    # As SGLang launched for the fixtures: --batching-max-size 8, no padding beyond 10.
    settings = ReferenceServerSettings(
        max_batch_size=8,
        policy="hold",
        family_settings={"action_stats_path": STATS_PATH, "padded_action_dim": 10},
    )
    with serve_in_thread(settings) as base_url:
        yield base_url


def test_fixtures_are_present():
    assert len(ERROR_FILES) >= 15
    for name in REQUEST_FILES:
        assert (FIXTURES / name).is_file()


def test_envelope_response_has_the_structure_of_sglangs(url):
    expected = load("envelope_response.json")
    response = requests.post(url + GENERATIONS, json=load("envelope_request.json"), timeout=10)
    assert response.status_code == 200, response.text
    ours = response.json()
    assert structure(ours) == structure(expected)
    for key in ("id", "object", "usage"):
        assert ours[key] == expected[key]
    for our_item, sglang_item in zip(ours["data"], expected["data"], strict=True):
        assert {k: v for k, v in our_item["action"].items() if k != "values"} == {
            k: v for k, v in sglang_item["action"].items() if k != "values"
        }
        assert {k: v for k, v in our_item.items() if k != "action"} == {
            k: v for k, v in sglang_item.items() if k != "action"
        }


def test_raw_response_has_the_structure_of_sglangs(url):
    expected = load("raw_response.json")
    response = requests.post(url + GENERATIONS, json=load("raw_request.json"), timeout=10)
    assert response.status_code == 200, response.text
    ours = response.json()
    assert structure(ours) == structure(expected)
    assert {k: v for k, v in ours.items() if k != "actions"} == {
        k: v for k, v in expected.items() if k != "actions"
    }


def test_fixture_requests_also_work_as_msgpack_with_numpy_values(url):
    request = load("envelope_request.json")
    request["input"]["input_reference"] = np.asarray(
        request["input"]["input_reference"], dtype=np.uint8
    )
    response = requests.post(
        url + GENERATIONS,
        data=codec.pack(request),
        headers={"Content-Type": "application/msgpack"},
        timeout=10,
    )
    assert response.status_code == 200
    values = codec.unpack(response.content)["data"][0]["action"]["values"]
    expected = load("envelope_response.json")["data"][0]["action"]["values"]
    assert values.dtype == np.float32 and values.shape == np.asarray(expected).shape


@pytest.mark.parametrize("path", ERROR_FILES, ids=[path.stem for path in ERROR_FILES])
def test_bad_fixture_requests_are_rejected_with_sglangs_status_and_body(url, path):
    fixture = load(path)
    response = requests.post(url + GENERATIONS, json=fixture["request"], timeout=10)
    assert response.status_code == fixture["status_code"]
    assert response.json() == fixture["body"]


# --- The same fixtures through SGLang itself (its side environment, tests/sglang_side) -----


def sglang_parse(sglang_side, payload: dict[str, Any]) -> dict[str, Any]:
    """SGLang's build_cosmos3_action_sampling_params on the request body, as it arrives."""
    return sglang_side.call(
        "cosmos3_parse", body=json.dumps(payload).encode(), content_type="application/json"
    )


@pytest.mark.parametrize("name", REQUEST_FILES)
def test_sglang_parses_the_fixture_requests(sglang_side, name):
    request = load(name)
    params = sglang_parse(sglang_side, request)
    batch = len(request["input"]["input_reference"])
    assert params["request_id"] == request["request_id"]
    assert (params["num_frames"], params["domain_name"], params["raw_action_dim"]) == (
        17,
        "libero",
        10,
    )
    assert (
        params["seed"],
        params["num_inference_steps"],
        params["height"],
        params["width"],
    ) == (1140, 30, 192, 320)
    assert params["image_sizes"] == [[4, 4]] * batch


@pytest.mark.parametrize(
    "path",
    [path for path in ERROR_FILES if "api.py" not in load(path)["source"]],
    ids=lambda path: path.stem,
)
def test_sglang_rejects_the_bad_fixture_requests_with_the_same_message(sglang_side, path):
    fixture = load(path)
    with pytest.raises(ValueError, match=re.escape(fixture["body"]["detail"])):
        sglang_parse(sglang_side, fixture["request"])


def sglang_server_of(config: dict, extra_args: list[str]) -> list[str]:
    """The serve command of slot 0 of ``config`` served by SGLang with ``extra_args``."""
    from libero_eval.config_server import server_settings
    from libero_eval.serve.command import build_command

    config = {**config, "server": {**config["server"], "backend": "sglang"}}
    config["server"]["sglang"] = {
        **config["server"]["sglang"],
        "model_path": "models/cosmos3",
        "extra_args": extra_args,
    }
    return build_command(server_settings(config, 0))


def test_sglangs_own_warmup_runs_the_runs_request_shape(sglang_side, default_config):
    """SGLang warms up at its default 832x480; the serve command asks for the run's shape
    (policy.cosmos3.size, num_frames), which SGLang's own parser takes."""
    argv = sglang_server_of(default_config, [])
    cosmos3 = default_config["policy"]["cosmos3"]
    assert argv[-4:] == [
        *("--warmup-resolutions", cosmos3["size"]),
        *("--warmup-num-frames", str(cosmos3["num_frames"])),
    ]
    seen = sglang_side.call("serve_args", argv=argv[2:])
    assert seen["unknown"] == [] and seen["diffusion_backend"]
    assert seen["parsed"]["warmup_resolutions"] == ["320x192"]
    assert seen["parsed"]["warmup_num_frames"] == 17
    # a warm-up the user set in server.sglang.extra_args is theirs
    argv = sglang_server_of(default_config, ["--warmup-mode", "off"])
    assert argv[-2:] == ["--warmup-mode", "off"] and "--warmup-resolutions" not in argv
