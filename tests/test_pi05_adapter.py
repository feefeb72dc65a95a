"""π0.5 adapter: openpi's LIBERO transforms on the client, requests and answers of each API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.spatial.transform import Rotation

import libero_eval.policy.families.pi05.openpi_transforms as T
from libero_eval.policy.connection import policy_connection_spec
from libero_eval.policy.families import Observation, make_adapter
from libero_eval.policy.families.pi05.adapter import Pi05Adapter
from libero_eval.policy.http_connection import PolicyResponseError

REPO_ROOT = Path(__file__).resolve().parents[1]
STATS = REPO_ROOT / "src" / "libero_eval" / "data" / "stats" / "pi05_libero_norm_stats.json"


def observation(seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    agentview = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    wrist = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    quat = Rotation.from_rotvec([2.9, 0.2, -0.1]).as_quat()  # x, y, z, w
    return Observation(
        agentview=agentview,
        wrist=wrist,
        task_language="put the bowl on the plate",
        proprio={
            "robot0_eef_pos": np.array([-0.05, 0.02, 1.1]),
            "robot0_eef_quat": quat,
            "robot0_gripper_qpos": np.array([0.03, -0.03]),
        },
    )


def adapter(**overrides) -> Pi05Adapter:
    return make_adapter("pi05", {"pi05": {"norm_stats_path": str(STATS), **overrides}})


# --- transforms ---------------------------------------------------------------------------


def test_resize_with_pad_keeps_the_aspect_and_centres_on_zeros():
    image = np.full((100, 200, 3), 255, dtype=np.uint8)
    out = T.resize_with_pad(image, 224, 224)
    assert out.shape == (224, 224, 3)
    # 200 wide -> 224 wide, 100 high -> int(100 / (200 / 224)) = 112 high, padded 56 above
    assert out[:56].max() == 0 and out[56 + 112 :].max() == 0
    assert out[56 : 56 + 112].min() == 255


def test_resize_with_pad_of_a_square_frame_is_plain_bilinear_resize():
    image = observation().agentview
    expected = np.asarray(Image.fromarray(image).resize((224, 224), resample=Image.BILINEAR))
    np.testing.assert_array_equal(T.resize_with_pad(image, 224, 224), expected)
    assert T.resize_with_pad(expected, 224, 224) is expected  # right size: unchanged


def test_state_is_position_axis_angle_and_gripper_joints():
    obs = observation()
    state = T.libero_state(**{k.removeprefix("robot0_"): v for k, v in obs.proprio.items()})
    np.testing.assert_allclose(state[:3], obs.proprio["robot0_eef_pos"])
    np.testing.assert_allclose(state[3:6], [2.9, 0.2, -0.1], atol=1e-9)
    np.testing.assert_allclose(state[6:], obs.proprio["robot0_gripper_qpos"])
    np.testing.assert_array_equal(T.quat_to_axis_angle([0, 0, 0, 1]), np.zeros(3))


def test_quantile_normalization_uses_openpis_formula_and_inverts():
    stats = T.load_norm_stats(STATS)
    assert stats.convention == "openpi"
    x = np.linspace(-1, 1, 7)
    q01, q99 = stats.actions.q01, stats.actions.q99
    expected = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1
    np.testing.assert_array_equal(T.normalize(x, stats.actions, "quantile", "openpi"), expected)
    for normalization in ("quantile", "zscore"):
        for convention in ("openpi", "lerobot"):
            y = T.normalize(x, stats.actions, normalization, convention)
            back = T.unnormalize(y, stats.actions, normalization, convention)
            # LeRobot's z-score divides by std + 1e-8 but multiplies back by std alone
            np.testing.assert_allclose(back, x, atol=1e-6)


def test_unnormalize_leaves_channels_beyond_the_statistics_alone():
    stats = T.load_norm_stats(STATS)
    model = np.zeros((50, 32))
    out = T.unnormalize(model, stats.actions, "quantile", "openpi")
    expected = (stats.actions.q01 + stats.actions.q99 + 1e-6) / 2
    np.testing.assert_allclose(out[:, :7], np.broadcast_to(expected, (50, 7)))
    np.testing.assert_array_equal(out[:, 7:], 0)


def test_lerobot_statistics_load_from_safetensors_and_stats_json(tmp_path):
    from safetensors.numpy import save_file

    raw = json.loads(STATS.read_text())["norm_stats"]
    flat = {
        f"{feature}.{stat}": np.asarray(values, dtype=np.float32)
        for feature, block in (("observation.state", raw["state"]), ("action", raw["actions"]))
        for stat, values in block.items()
    }
    path = tmp_path / "policy_preprocessor_step_3_normalizer_processor.safetensors"
    save_file(flat, str(path))
    for source in (path, tmp_path):  # the file, or the checkpoint directory holding it
        stats = T.load_norm_stats(source)
        assert stats.convention == "lerobot"
        np.testing.assert_allclose(stats.state.q99, raw["state"]["q99"], rtol=1e-6)
    nested = tmp_path / "stats.json"
    nested.write_text(json.dumps({"observation.state": raw["state"], "action": raw["actions"]}))
    assert T.load_norm_stats(nested).actions.dim == 7


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"norm_stats": {"state": {"q01": [0] * 8, "q99": [1] * 8}}}, "no 'actions' block"),
        (
            {"norm_stats": {"state": {"q01": [0] * 6, "q99": [1] * 6}, "actions": {}}},
            "none of mean",
        ),
        (
            {
                "norm_stats": {
                    "state": {"q01": [0] * 6, "q99": [1] * 6},
                    "actions": {"q01": [0] * 7, "q99": [1] * 7},
                }
            },
            "state block has 6 channels",
        ),
        (
            {
                "norm_stats": {
                    "state": {"mean": [0] * 8, "std": [1] * 8},
                    "actions": {"mean": [0] * 7, "std": [1] * 7},
                }
            },
            "no q01/q99",
        ),
        ({"global": {}}, "no 'observation.state', 'action' block"),
    ],
    ids=["missing-actions", "empty-block", "wrong-shape", "no-quantiles", "cosmos3-file"],
)
def test_bad_statistics_name_the_file_and_the_fix(tmp_path, content, message):
    path = tmp_path / "norm_stats.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match="policy.pi05.norm_stats_path") as excinfo:
        make_adapter("pi05", {"pi05": {"norm_stats_path": str(path)}})
    assert message in str(excinfo.value)
    assert str(path) in str(excinfo.value)
    assert "norm_stats.json" in str(excinfo.value)  # the fix: the checkpoint's own stats


# --- requests -----------------------------------------------------------------------------


def test_sglang_http_request_is_sglangs_pi05_envelope():
    obs = observation()
    payload = adapter().build_request([obs], "req-1")
    assert payload["request_id"] == "req-1"
    assert payload["parameters"] == {
        "action_horizon": 50,
        "action_dim": 32,
        "num_inference_steps": 10,
    }
    assert payload["runtime"] == {"response_format": "envelope", "output_format": "numpy"}
    block = payload["input"]
    assert block["prompt"] == "put the bowl on the plate"
    images, masks = block["observation"]["images"], block["observation"]["image_masks"]
    assert list(images) == ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    assert masks == {"base_0_rgb": True, "left_wrist_0_rgb": True, "right_wrist_0_rgb": False}
    flipped = T.resize_with_pad(obs.agentview[::-1, ::-1].copy(), 224, 224)
    np.testing.assert_array_equal(images["base_0_rgb"], flipped)
    np.testing.assert_array_equal(
        images["left_wrist_0_rgb"], T.resize_with_pad(obs.wrist[::-1, ::-1].copy(), 224, 224)
    )
    assert not images["right_wrist_0_rgb"].any()
    state = block["observation"]["state"]
    assert state.dtype == np.float32 and state.shape == (32,)
    stats = T.load_norm_stats(STATS)
    raw = adapter().raw_state(obs)
    expected = (raw - stats.state.q01) / (stats.state.q99 - stats.state.q01 + 1e-6) * 2 - 1
    np.testing.assert_allclose(state[:8], expected, rtol=1e-6)
    assert not state[8:].any()


def test_unpadded_state_and_json_wire_are_settings():
    payload = adapter(pad_state_to=None, wire_format="json").build_request([observation()], "r")
    assert len(payload["input"]["observation"]["state"]) == 8
    assert payload["input"]["observation"]["images"]["base_0_rgb"]["b64_json"]
    assert payload["runtime"]["output_format"] == "list"


def test_websocket_requests_are_sglang_flat_maps_or_openpis_raw_observation():
    obs = observation()
    sglang = adapter(api="sglang_websocket")
    endpoint = policy_connection_spec("http://h:1", "pi05", {"pi05": {"api": "sglang_websocket"}})
    assert (endpoint.channel, endpoint.path, endpoint.health_path) == (
        "websocket",
        "/openpi/policy",
        "/health",
    )
    flat = sglang.build_request([obs], "r")
    assert flat["prompt"] == obs.task_language and flat["state"].shape == (32,)
    assert set(flat["images"]) == set(T.IMAGE_KEYS) and flat["action_dim"] == 32
    openpi = adapter(api="openpi_websocket")
    endpoint = policy_connection_spec("http://h:1", "pi05", {"pi05": {"api": "openpi_websocket"}})
    assert (endpoint.path, endpoint.health_path) == ("", "/healthz")
    raw = openpi.build_request([obs], "r")
    assert sorted(raw) == [
        "observation/image",
        "observation/state",
        "observation/wrist_image",
        "prompt",
    ]
    assert raw["observation/image"].shape == (224, 224, 3)
    np.testing.assert_array_equal(raw["observation/state"], openpi.raw_state(obs))


def test_one_observation_per_request():
    with pytest.raises(ValueError, match="one observation per request"):
        adapter().build_request([observation(0), observation(1)], "r")


# --- answers ------------------------------------------------------------------------------


def test_model_space_answer_becomes_first_seven_channels_de_normalized():
    a = adapter()
    model = np.random.default_rng(1).uniform(-1, 1, (50, 32)).astype(np.float32)
    response = {"data": [{"index": 0, "input_index": 0, "action": {"values": model}}]}
    actions = a.parse_response(response, 1)
    assert actions.shape == (1, 5, 7)
    stats = T.load_norm_stats(STATS)
    expected = (model[:5, :7] + 1) / 2 * (stats.actions.q99 - stats.actions.q01 + 1e-6)
    np.testing.assert_allclose(actions[0], expected + stats.actions.q01, rtol=1e-6)
    raw = a.parse_response({"actions": model}, 1)  # response_format raw / SGLang websocket
    np.testing.assert_array_equal(raw, actions)


def test_openpi_answer_is_used_as_is_but_a_model_space_answer_is_refused():
    a = adapter(api="openpi_websocket")
    libero = np.random.default_rng(2).uniform(-1, 1, (10, 7))
    np.testing.assert_array_equal(a.parse_response({"actions": libero}, 1)[0], libero[:5])
    with pytest.raises(PolicyResponseError, match=r"\[50, 32\].*sglang_websocket"):
        a.parse_response({"actions": np.zeros((50, 32))}, 1)
    with pytest.raises(PolicyResponseError, match="fewer than policy.pi05.replan_steps"):
        a.parse_response({"actions": np.zeros((3, 7))}, 1)


def test_metadata_of_another_family_is_refused():
    with pytest.raises(PolicyResponseError, match="serves family 'cosmos3'"):
        adapter().check_server_metadata({"policy_family": "cosmos3"})
    with pytest.raises(PolicyResponseError, match="set it to sglang_websocket"):
        adapter(api="openpi_websocket").check_server_metadata({"policy_family": "pi05"})
    adapter().check_server_metadata({"policy_family": "pi05"})
    adapter(api="openpi_websocket").check_server_metadata({})  # openpi's own metadata


def test_a_lerobot_checkpoint_says_which_normalization_it_uses(tmp_path):
    from safetensors.numpy import save_file

    raw = json.loads(STATS.read_text())["norm_stats"]
    flat = {
        f"{feature}.{stat}": np.asarray(values, dtype=np.float32)
        for feature, block in (("observation.state", raw["state"]), ("action", raw["actions"]))
        for stat, values in block.items()
    }
    save_file(flat, str(tmp_path / "policy_preprocessor_step_2_normalizer_processor.safetensors"))
    step = {
        "registry_name": "normalizer_processor",
        "config": {"norm_map": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}},
        "state_file": "policy_preprocessor_step_2_normalizer_processor.safetensors",
    }
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps({"steps": [step]}))
    with pytest.raises(ValueError, match="normalizes the state with zscore.*normalization: zscore"):
        adapter(norm_stats_path=str(tmp_path))
    assert (
        adapter(norm_stats_path=str(tmp_path), normalization="zscore").stats.state_mode == "zscore"
    )


def test_without_a_checkpoint_or_statistics_the_adapter_names_the_field_and_the_fix():
    """No made-up fallback: a run with nothing to normalize with is refused."""
    with pytest.raises(ValueError) as error:
        Pi05Adapter({"pi05": {"api": "sglang_http"}})
    message = str(error.value)
    assert message.startswith("policy.pi05.norm_stats_path: no statistics to normalize with")
    assert "Set policy.pi05.norm_stats_path" in message
    assert "libero_eval:stats/pi05_libero_norm_stats.json" in message
