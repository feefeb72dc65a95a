"""π0.5 requests against each checkpoint lineage's real layout, through SGLang 0.5.23's own code.

A checkpoint directory is built as the lineage's real one is laid out (config.json and its
statistics; no weights). SGLang's own ``Pi05PolicyModel._apply_checkpoint_config`` rewrites
its config from it, and ``Pi05Preprocessor`` turns the project's exact request bytes into the
model's inputs (``tests/sglang_side``). Every configured camera must arrive with mask True, the
state width must be accepted, and the prompt or tokens must be what the lineage's training code
makes for the same observation (``tests/reference_code``).
"""

from __future__ import annotations

import numpy as np
import pytest
import sentencepiece
from conftest import pi05_checkpoint
from reference_code.prompts import lerobot_prompt, openpi_tokenize
from sglang_side import SglangValueError
from test_pi05_adapter import observation
from test_pi05_contract import encoded

import libero_eval.policy.families.pi05.reference as reference
from libero_eval.policy.families import make_adapter
from libero_eval.policy.families.pi05.checkpoint import CheckpointError, read_checkpoint


def lineage_adapter(checkpoint, **settings):
    return make_adapter("pi05", {"pi05": {"checkpoint": str(checkpoint), **settings}})


def parse(sglang_side, adapter, checkpoint, wire: str = "msgpack") -> dict:
    body, content_type = encoded(adapter.build_request([observation()], "r"), wire)
    return sglang_side.call(
        "pi05_parse", body=body, content_type=content_type, route="http", checkpoint=str(checkpoint)
    )


def assert_cameras_reach_the_model(parsed: dict, adapter) -> None:
    layout = adapter.layout
    assert parsed["config"]["image_keys"] == list(layout.camera_keys)
    for key, view in layout.camera_views.items():
        assert parsed["images"][key]["mask"] is (view is not None), key
        assert parsed["images"][key]["shape"] == [1, 3, 224, 224]


@pytest.mark.parametrize(
    ("lineage", "layout"),
    [
        ("lerobot", {}),
        ("lerobot", {"chunk_size": 10, "n_action_steps": 10}),
        ("openpi", {}),
        ("openpi", {"action_horizon": 50}),
    ],
    ids=["lerobot-50", "lerobot-10", "openpi-10", "openpi-50"],
)
def test_the_layout_read_is_the_one_sglangs_loader_derives(sglang_side, lineage, layout):
    checkpoint = pi05_checkpoint(lineage, **layout)
    ours = read_checkpoint(checkpoint)
    a = lineage_adapter(checkpoint, discrete_state_input=False if lineage == "openpi" else None)
    parsed = parse(sglang_side, a, checkpoint)
    assert parsed["config"] == {
        "image_keys": list(ours.camera_keys),
        "state_dim": ours.state_dim,
        "action_horizon": ours.action_horizon,
        "action_dim": ours.action_dim,
        "max_token_len": ours.max_token_len,
    }
    assert parsed["action_horizon"] == ours.action_horizon  # the request asks for it too


@pytest.mark.parametrize("wire", ["msgpack", "json"])
def test_lerobot_lineage_gets_its_cameras_state_and_sglangs_own_prompt(sglang_side, wire):
    checkpoint = pi05_checkpoint("lerobot")
    a = lineage_adapter(checkpoint, wire_format=wire)
    parsed = parse(sglang_side, a, checkpoint, wire)
    assert_cameras_reach_the_model(parsed, a)
    assert parsed["config"]["image_keys"] == ["image", "image2"]
    state = a.normalized_state(observation()).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(parsed["state"], dtype=np.float32)[0], state)
    # LeRobot >= 0.5's Pi05PrepareStateTokenizerProcessorStep on the same normalized state
    assert parsed["full_prompt"] == lerobot_prompt(state, observation().task_language)


def test_lerobot_lineage_images_reach_the_model_as_lerobots_preprocessing_makes_them(
    sglang_side,
):
    """The float images the client sends become, after SGLang's resize, the pixels LeRobot's
    own pipeline (flip, resize_with_pad_torch, [-1, 1]) feeds SigLIP."""
    checkpoint = pi05_checkpoint("lerobot")
    parsed = parse(sglang_side, lineage_adapter(checkpoint), checkpoint)
    obs = observation()
    for key, frame in (("image", obs.agentview), ("image2", obs.wrist)):
        expected = sglang_side.call(
            "lerobot_model_image", frame=frame.tobytes(), shape=list(frame.shape)
        )
        got = np.frombuffer(parsed["images"][key]["values"], np.float32).reshape(3, 224, 224)
        want = np.frombuffer(expected, np.float32).reshape(3, 224, 224)
        # exactly: uint8 images would be rounded by SGLang (0.0039 apart in [-1, 1])
        np.testing.assert_array_equal(got, want, err_msg=key)


def test_lerobot_044_lineage_gets_lerobots_padded_prompt_as_tokens(sglang_side):
    checkpoint = pi05_checkpoint("lerobot")
    a = lineage_adapter(checkpoint, lerobot_prompt="padded")
    parsed = parse(sglang_side, a, checkpoint)
    assert_cameras_reach_the_model(parsed, a)
    assert parsed["full_prompt"] is None  # SGLang used our tokens, built no prompt
    state = a.normalized_state(observation()).astype(np.float32)
    text = lerobot_prompt(state, observation().task_language, max_state_dim=32)
    assert text.count(" 128") >= 24  # the 24 zero-padding entries, bin 128
    expected = sglang_side.call(
        "hf_tokenize", tokenizer_json=str(checkpoint / "tokenizer.json"), text=text, max_length=200
    )
    assert parsed["tokens"] == expected["input_ids"]
    assert parsed["token_masks"] == expected["attention_mask"]


@pytest.mark.parametrize("discrete_state_input", [False, True])
def test_openpi_lineage_gets_openpis_slots_and_tokens(sglang_side, discrete_state_input):
    checkpoint = pi05_checkpoint("openpi")
    a = lineage_adapter(checkpoint, discrete_state_input=discrete_state_input)
    parsed = parse(sglang_side, a, checkpoint)
    assert_cameras_reach_the_model(parsed, a)
    assert parsed["config"]["image_keys"] == ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    assert parsed["full_prompt"] is None
    spm = sentencepiece.SentencePieceProcessor(model_file=str(checkpoint / "tokenizer.model"))
    state = a.normalized_state(observation()) if discrete_state_input else None
    tokens, masks = openpi_tokenize(spm, 200, observation().task_language, state)
    assert parsed["tokens"] == tokens.tolist()
    assert parsed["token_masks"] == masks.tolist()
    assert 4 < sum(masks) < 60  # a realistic length: words and state values, not characters


def test_todays_default_layout_fails_against_a_lerobot_checkpoint(sglang_side):
    """What the project sent before it read checkpoints: openpi's camera names and a 32-wide
    state. SGLang refuses the state; and narrowed to 8 values, both cameras arrive blank."""
    checkpoint = pi05_checkpoint("lerobot")
    default = make_adapter(
        "pi05", {"pi05": {"norm_stats_path": "libero_eval:stats/pi05_libero_norm_stats.json"}}
    )
    with pytest.raises(SglangValueError, match="state dim must be <= 8, got 32"):
        parse(sglang_side, default, checkpoint)
    narrowed = make_adapter(
        "pi05",
        {
            "pi05": {
                "pad_state_to": None,
                "norm_stats_path": "libero_eval:stats/pi05_libero_norm_stats.json",
            }
        },
    )
    parsed = parse(sglang_side, narrowed, checkpoint)
    assert {key: parsed["images"][key]["mask"] for key in ("image", "image2")} == {
        "image": False,
        "image2": False,
    }


@pytest.mark.parametrize("horizon", [10, 50])
def test_horizons_10_and_50_replan_every_5(horizon):
    a = lineage_adapter(pi05_checkpoint("lerobot", chunk_size=horizon, n_action_steps=horizon))
    assert a.build_request([observation()], "r")["parameters"]["action_horizon"] == horizon
    answer = np.zeros((horizon, 32), dtype=np.float32)
    assert a.parse_response({"actions": answer}, 1).shape == (1, 5, 7)


def test_a_configured_value_that_contradicts_the_checkpoint_is_refused_naming_both():
    checkpoint = pi05_checkpoint("lerobot")
    with pytest.raises(ValueError, match=r"pad_state_to is 32 but the checkpoint says 8"):
        lineage_adapter(checkpoint, pad_state_to=32)
    with pytest.raises(ValueError, match=r"action_horizon is 10 but the checkpoint says 50"):
        lineage_adapter(checkpoint, action_horizon=10)
    with pytest.raises(CheckpointError, match="not a local directory.*huggingface-cli download"):
        lineage_adapter("lerobot/pi05_libero_finetuned")
    with pytest.raises(ValueError, match="discrete_state_input must be set"):
        lineage_adapter(pi05_checkpoint("openpi"))


def test_an_openpi_conversion_without_chunk_size_is_refused(tmp_path):
    from random_checkpoint.pi05_layouts import openpi_config, write_openpi

    write_openpi(tmp_path)
    config = openpi_config()
    del config["chunk_size"]
    (tmp_path / "config.json").write_text(__import__("json").dumps(config))
    with pytest.raises(CheckpointError, match=r'Add "chunk_size": 10 to config.json'):
        read_checkpoint(tmp_path)


def test_the_reference_server_refuses_what_a_lerobot_checkpoint_would_not_see():
    """The self-test's server, standing in for a LeRobot checkpoint, names the convention."""
    model = reference.Pi05Model.load(pi05_checkpoint("lerobot"))
    default = make_adapter(
        "pi05", {"pi05": {"norm_stats_path": "libero_eval:stats/pi05_libero_norm_stats.json"}}
    )
    with pytest.raises(reference.Pi05RequestError, match="unknown image key.*blank images"):
        reference.parse_request(default.build_request([observation()], "r"), model, websocket=False)
    narrowed = make_adapter(
        "pi05", {"pi05": {"checkpoint": str(pi05_checkpoint("lerobot")), "pad_state_to": None}}
    )
    body = narrowed.build_request([observation()], "r")
    body["input"]["observation"]["state"] = np.zeros(32, np.float32)
    with pytest.raises(reference.Pi05RequestError, match="state dim must be <= 8, got 32"):
        reference.parse_request(body, model, websocket=False)
    assert reference.parse_request(
        narrowed.build_request([observation()], "r"), model, websocket=False
    )


def test_the_reference_server_wants_openpis_tokens_from_an_openpi_client():
    model = reference.Pi05Model.load(pi05_checkpoint("openpi"))
    a = lineage_adapter(pi05_checkpoint("openpi"), discrete_state_input=False)
    body = a.build_request([observation()], "r")
    assert reference.parse_request(body, model, websocket=False).action_horizon == 10
    del body["input"]["observation"]["tokens"]
    with pytest.raises(reference.Pi05RequestError, match="needs openpi's prompt as tokens"):
        reference.parse_request(body, model, websocket=False)


# --- LeRobot's empty cameras: each image block once, as LeRobot feeds them ----------------------


LEROBOT_BLOCKS = ["image", "image2", "empty_camera_0"]


def test_a_checkpoint_trained_with_an_empty_camera_names_it_twice_for_sglang():
    """LeRobot's LIBERO recipe (``--policy.empty_cameras=1``) saves the empty camera in
    ``input_features`` and keeps ``empty_cameras: 1``; SGLang's loader counts it twice, LeRobot
    feeds it once after the real cameras: the request carries LeRobot's order."""
    layout = read_checkpoint(pi05_checkpoint("lerobot", empty_cameras=1))
    assert layout.camera_keys == ("image", "image2", "empty_camera_0", "empty_camera_0")
    assert layout.camera_order == tuple(LEROBOT_BLOCKS)
    assert layout.camera_views == {"image": "agentview", "image2": "wrist", "empty_camera_0": None}
    plain = read_checkpoint(pi05_checkpoint("lerobot"))
    assert plain.camera_keys == ("image", "image2") and plain.camera_order is None
    assert read_checkpoint(pi05_checkpoint("openpi")).camera_order is None


@pytest.mark.parametrize(
    ("api", "wire"),
    [("sglang_http", "msgpack"), ("sglang_http", "json"), ("sglang_websocket", "msgpack")],
)
def test_the_request_carries_camera_order_only_where_sglangs_keys_differ(api, wire):
    def observation_of(checkpoint) -> dict:
        body = lineage_adapter(checkpoint, api=api, wire_format=wire).build_request(
            [observation()], "r"
        )
        return body["input"]["observation"] if api == "sglang_http" else body

    sent = observation_of(pi05_checkpoint("lerobot", empty_cameras=1))
    assert sent["camera_order"] == LEROBOT_BLOCKS
    assert sent["image_masks"] == {"image": True, "image2": True, "empty_camera_0": False}
    assert sorted(sent["images"]) == ["image", "image2"]  # the blank one is SGLang's to make
    assert "camera_order" not in observation_of(pi05_checkpoint("lerobot"))


def test_lerobot_feeds_the_cameras_it_has_before_the_blank_ones(tmp_path):
    """``_preprocess_images`` appends the missing cameras' blank blocks after the present ones,
    whatever their place in ``input_features``."""
    import json

    from random_checkpoint.pi05_layouts import lerobot_config, write_lerobot

    write_lerobot(tmp_path)
    config = lerobot_config(empty_cameras=1)
    features = config["input_features"]
    config["input_features"] = {
        "observation.images.empty_camera_0": features.pop("observation.images.empty_camera_0"),
        **features,
    }
    config["empty_cameras"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    layout = read_checkpoint(tmp_path)
    assert layout.camera_keys == ("empty_camera_0", "image", "image2")
    assert layout.camera_order == ("image", "image2", "empty_camera_0")


@pytest.mark.parametrize(
    ("api", "wire"),
    [("sglang_http", "msgpack"), ("sglang_http", "json"), ("sglang_websocket", "msgpack")],
)
def test_sglang_encodes_lerobots_three_image_blocks_not_four(sglang_side, api, wire):
    """Through SGLang's own loader, request handling and ``Pi05Preprocessor``: the blocks the
    model encodes (``camera_order``, which ``encode_prefix`` iterates) are LeRobot's three;
    without the request's ``camera_order`` they would be SGLang's four."""
    from libero_eval.policy import codec

    checkpoint = pi05_checkpoint("lerobot", empty_cameras=1)
    a = lineage_adapter(checkpoint, api=api, wire_format=wire)
    body = a.build_request([observation()], "r")

    def blocks(body: dict) -> dict:
        if api == "sglang_websocket":
            frame, content_type, route = codec.pack(body), "msgpack", "ws"
        else:
            (frame, content_type), route = encoded(body, wire), "http"
        parsed = sglang_side.call(
            "pi05_parse",
            body=frame,
            content_type=content_type,
            route=route,
            checkpoint=str(checkpoint),
        )
        assert parsed["config"]["image_keys"] == list(a.layout.camera_keys)  # the duplicate
        return parsed

    parsed = blocks(body)
    assert parsed["camera_order"] == LEROBOT_BLOCKS
    assert {key: parsed["images"][key]["mask"] for key in LEROBOT_BLOCKS} == {
        "image": True,
        "image2": True,
        "empty_camera_0": False,
    }
    blank = np.frombuffer(parsed["images"]["empty_camera_0"]["values"], np.float32)
    assert blank.size == 3 * 224 * 224 and np.all(blank == -1.0)  # LeRobot's -1 padding
    state = a.normalized_state(observation()).astype(np.float32)
    assert parsed["full_prompt"] == lerobot_prompt(state, observation().task_language)
    sent = body["input"]["observation"] if api == "sglang_http" else body
    del sent["camera_order"]
    assert blocks(body)["camera_order"] == [*LEROBOT_BLOCKS, "empty_camera_0"]


def test_the_reference_server_wants_lerobots_image_blocks():
    """The self-test's server, standing in for such a checkpoint, refuses a request without
    ``camera_order`` (SGLang would encode four blocks) or with another order."""
    checkpoint = pi05_checkpoint("lerobot", empty_cameras=1)
    model = reference.Pi05Model.load(checkpoint)
    body = lineage_adapter(checkpoint).build_request([observation()], "r")
    assert reference.parse_request(body, model, websocket=False)
    sent = body["input"]["observation"]
    sent["camera_order"] = ["image2", "image", "empty_camera_0"]
    with pytest.raises(reference.Pi05RequestError, match=r"image blocks are \['image', 'image2'"):
        reference.parse_request(body, model, websocket=False)
    del sent["camera_order"]
    with pytest.raises(reference.Pi05RequestError, match="empty camera twice"):
        reference.parse_request(body, model, websocket=False)
    plain = reference.Pi05Model.load(pi05_checkpoint("lerobot"))
    ws = lineage_adapter(pi05_checkpoint("lerobot"), api="sglang_websocket")
    assert reference.parse_request(ws.build_request([observation()], "r"), plain, websocket=True)
