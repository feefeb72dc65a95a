"""The reference server's π0.5 side: SGLang 0.5.23's π0.5 action API served by the expert.

Requests are read as SGLang's ``protocol.py`` reads them (``_action_request_to_observation``,
``_build_action_model_sampling_params``): the HTTP envelope ``{"input": {"prompt",
"observation": {"images", "image_masks", "state"}}, "parameters", "runtime"}`` or the flat map
of the ``/openpi/policy`` websocket. One observation per request, as ``Pi05Preprocessor``
requires. The server then acts as the model would expect its inputs, strictly:

- the image blocks must be the checkpoint's: ``camera_order`` where SGLang's keys differ from
  LeRobot's (``Pi05Layout.camera_order``), else none or SGLang's own;
- the state must have the model's state dim (a client that forgets to pad fails), its
  padding must be zeros, and with privileged state on, the state de-normalized with the
  MODEL's statistics (``server.reference.norm_stats_path``) must be the robot's own state
  (a client normalizing with other statistics fails);
- with privileged state on, the images must be the model's preprocessing of the raw camera
  frames (:func:`pi05_image`, :func:`lerobot_image`; ``reference_host.image_check``).

Answers are what SGLang returns: ``[action_horizon, model_action_dim]`` float32 in model
space (the expert's LIBERO chunk normalized with the model's statistics, zero-padded).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import libero_eval.policy.families.pi05.openpi_transforms as T
from libero_eval.policy.families.pi05.checkpoint import Pi05Layout, read_checkpoint
from libero_eval.policy.reference_host import PolicyItem, RequestError, image_check

STATE_TOLERANCE = 1e-3  # float32 round trip of a normalized state, in metres / radians


class Pi05RequestError(RequestError):
    """A π0.5 request the server rejects (HTTP 400, or an error frame on the websocket)."""


@dataclass(frozen=True)
class Pi05Model:
    """The model side: its statistics and its layout, as SGLang derives it from a checkpoint
    (``policy/families/pi05/checkpoint.py``), or SGLang's Pi05PipelineConfig defaults."""

    stats: T.NormStats
    normalization: str = "quantile"
    layout: Pi05Layout = Pi05Layout.sglang_default()
    image_size: int = 224

    @property
    def state_dim(self) -> int:
        return self.layout.state_dim

    @property
    def action_horizon(self) -> int:
        return self.layout.action_horizon

    @property
    def action_dim(self) -> int:
        return self.layout.action_dim

    @classmethod
    def load(cls, norm_stats_path: str | Path, **fields: Any) -> Pi05Model:
        """``norm_stats_path`` is a statistics file, or a checkpoint directory (its
        ``config.json`` gives the layout and it carries its statistics)."""
        path = Path(norm_stats_path)
        if path.is_dir() and (path / "config.json").is_file():
            layout = read_checkpoint(path)
            if layout.stats_path is None:
                raise ValueError(f"checkpoint {path} carries no statistics")
            fields["layout"], path = layout, layout.stats_path
        stats = T.load_norm_stats(path)
        recorded = stats.state_mode or stats.actions_mode
        if recorded in ("quantile", "zscore"):  # the checkpoint's own choice
            fields.setdefault("normalization", recorded)
        model = cls(stats=stats, **fields)
        T.check_stats(stats, model.normalization, T.LIBERO_STATE_DIM, T.LIBERO_ACTION_DIM)
        return model


@dataclass(frozen=True)
class Pi05Request:
    request_id: str
    item: PolicyItem
    action_horizon: int
    action_dim: int
    num_inference_steps: int
    response_format: str | None  # None on the websocket


def _array(value: Any, where: str, dtype: Any = None) -> np.ndarray:
    if isinstance(value, dict):  # SGLang's {"dtype", "shape", "values"|"data"} tensor payload
        values = value.get("values", value.get("data"))
        array = np.asarray(values, dtype=value.get("dtype") or dtype)
        if value.get("shape") is not None:
            array = array.reshape(value["shape"])
        return array
    try:
        return np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise Pi05RequestError(f"{where} is not a numeric array ({exc})") from exc


def _image(value: Any, key: str) -> np.ndarray:
    if isinstance(value, dict) and ("b64_json" in value or "base64" in value):
        import base64
        import io

        data = value.get("b64_json") or value.get("base64")
        if isinstance(data, str) and data.startswith("data:"):
            data = data.split(",", 1)[1]
        try:
            return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
        except Exception as exc:
            raise Pi05RequestError(f"images.{key}: unreadable base64 image ({exc})") from exc
    image = _array(value, f"images.{key}")
    if image.ndim != 3 or image.shape[-1] != 3:
        raise Pi05RequestError(f"images.{key}: expected an HWC image, got shape {image.shape}")
    return image


def parse_request(payload: Any, model: Pi05Model, *, websocket: bool) -> Pi05Request:
    """Read a π0.5 request as SGLang does; :class:`Pi05RequestError` on bad input."""
    if not isinstance(payload, dict):
        raise Pi05RequestError(f"request must be a map, got {type(payload).__name__}")
    if websocket or "input" not in payload:
        observation, parameters, runtime = payload, payload, {}
        privileged = payload.get("privileged_state")
    else:
        block = payload.get("input") or {}
        observation = {**(block.get("observation") or {}), "prompt": block.get("prompt")}
        if "task" in block:
            observation["prompt"] = block["task"]
        parameters, runtime = payload.get("parameters") or {}, payload.get("runtime") or {}
        privileged = block.get("privileged_state")
    if "input_reference" in (payload.get("input") or {}):
        raise Pi05RequestError(
            "this is a π0.5 server (Pi05Pipeline): it takes input.observation.images, not "
            "Cosmos3's input.input_reference; check policy.family"
        )
    prompt = observation.get("prompt") or observation.get("task") or ""
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise Pi05RequestError("Pi05 v1 expects one prompt per action request")
        prompt = prompt[0]
    images = observation.get("images")
    layout = model.layout
    keys = list(layout.camera_keys)
    if not isinstance(images, dict) or not images:
        raise Pi05RequestError(f"π0.5 requests need observation.images keyed by {keys}")
    unknown = sorted(set(images) - set(keys))
    if unknown:
        raise Pi05RequestError(
            f"unknown image key(s) {unknown}; the model's are {keys} ({layout.describe()}). "
            "SGLang would ignore them and feed the model blank images: the client's camera "
            "names do not follow the checkpoint's config.json"
        )
    order = observation.get("camera_order")
    wanted = list(layout.camera_order or keys)
    if (order is None and layout.camera_order) or (order is not None and list(order) != wanted):
        raise Pi05RequestError(
            f"camera_order is {order!r}; the model's image blocks are {wanted} "
            f"({layout.describe()}). Without it SGLang encodes its image_keys {keys}, an empty "
            "camera twice where LeRobot fed it once"
        )
    masks = observation.get("image_masks") or {}
    arrays = {key: _image(value, key) for key, value in images.items() if value is not None}
    for key, view in layout.camera_views.items():
        present = key in arrays and bool(masks.get(key, True))
        if view is not None and not present:
            raise Pi05RequestError(
                f"camera {key} ({view}) is missing or masked: the model would see a blank "
                f"image ({layout.describe()})"
            )
    state = observation.get("state")
    if state is None:
        raise Pi05RequestError("π0.5 requests need observation.state (normalized, padded)")
    state = _array(state, "state", np.float32).reshape(-1)
    if state.shape[0] > model.state_dim:
        raise Pi05RequestError(f"Pi05 state dim must be <= {model.state_dim}, got {state.shape[0]}")
    if state.shape[0] != model.state_dim:
        raise Pi05RequestError(
            f"the state has {state.shape[0]} entries; this model's state dim is "
            f"{model.state_dim}: zero-pad the normalized state (policy.pi05.pad_state_to)"
        )
    if np.any(state[T.LIBERO_STATE_DIM :] != 0):
        raise Pi05RequestError(
            f"state entries {T.LIBERO_STATE_DIM}..{model.state_dim - 1} must be zero padding"
        )
    _check_tokens(observation, layout)
    if privileged is not None:
        _check_state(state[: T.LIBERO_STATE_DIM], privileged, model)
        _check_images(arrays, masks, privileged, model)
    horizon = int(parameters.get("action_horizon", model.action_horizon))
    action_dim = int(parameters.get("action_dim", model.action_dim))
    if horizon <= 0 or action_dim <= 0:
        raise Pi05RequestError("action_horizon and action_dim must be positive")
    response_format = None
    if not websocket:
        response_format = str(runtime.get("response_format", "envelope")).lower()
        if response_format not in ("envelope", "raw"):
            raise Pi05RequestError("runtime.response_format must be 'envelope' or 'raw'")
    agentview_key = next(k for k, v in layout.camera_views.items() if v == "agentview")
    base = arrays.get(agentview_key)
    return Pi05Request(
        request_id=str(payload.get("request_id") or uuid.uuid4()),
        item=PolicyItem(
            image=_uint8(base) if base is not None else np.zeros((1, 1, 3), np.uint8),
            prompt=str(prompt),
            privileged_state=privileged,
        ),
        action_horizon=horizon,
        action_dim=action_dim,
        num_inference_steps=int(parameters.get("num_inference_steps", 10)),
        response_format=response_format,
    )


def _uint8(image: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] (LeRobot lineage) as uint8, for the policy's PolicyItem."""
    if np.issubdtype(image.dtype, np.floating):
        return np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)
    return image.astype(np.uint8)


def _check_tokens(observation: dict[str, Any], layout: Pi05Layout) -> None:
    """openpi-trained checkpoints need openpi's prompt as tokens (without them SGLang builds
    LeRobot's prompt); LeRobot ones may carry LeRobot 0.4.4's; tokens are padded to the
    checkpoint's max_token_len."""
    tokens = observation.get("tokens")
    if tokens is None:
        if layout.lineage == "openpi":
            raise Pi05RequestError(
                "this openpi-trained checkpoint needs openpi's prompt as tokens / token_masks: "
                "without them SGLang builds LeRobot's prompt ('Task: ..., State: ...;"
                "\\nAction: ') from the state, which openpi never trained on"
            )
        return
    if layout.lineage == "sglang_default":
        raise Pi05RequestError("tokens sent without a checkpoint layout: send no tokens")
    if observation.get("token_masks") is None:
        raise Pi05RequestError("tokens without token_masks")
    width = _array(tokens, "tokens").reshape(-1).shape[0]
    if width != layout.max_token_len:
        raise Pi05RequestError(
            f"tokens has {width} entries; the prompt is padded to the checkpoint's "
            f"max_token_len {layout.max_token_len}"
        )


OPENPI_ACTION_HORIZON = 10  # openpi's pi05_libero config answers 10 LIBERO actions
OPENPI_KEYS = ("observation/image", "observation/wrist_image", "observation/state", "prompt")


def parse_openpi_request(payload: Any, model: Pi05Model) -> Pi05Request:
    """openpi's ``serve_policy.py`` LIBERO request (``examples/libero/main.py``'s element):
    the raw observation, whose transforms the server runs. Checked like the SGLang forms:
    the 8-D state against the robot's, the images against the raw camera frames."""
    if not isinstance(payload, dict):
        raise Pi05RequestError(f"request must be a map, got {type(payload).__name__}")
    missing = [key for key in OPENPI_KEYS if key not in payload]
    if missing:
        hint = (
            " (this looks like SGLang's model-space form: use policy.pi05.api sglang_websocket)"
            if "images" in payload
            else ""
        )
        raise Pi05RequestError(f"openpi LIBERO request lacks {missing}{hint}")
    images = {
        "base_0_rgb": _image(payload["observation/image"], "observation/image"),
        "left_wrist_0_rgb": _image(payload["observation/wrist_image"], "observation/wrist_image"),
    }
    state = _array(payload["observation/state"], "observation/state", np.float64).reshape(-1)
    if state.shape != (T.LIBERO_STATE_DIM,):
        raise Pi05RequestError(
            f"observation/state must be LIBERO's {T.LIBERO_STATE_DIM} raw values (eef_pos, "
            f"axis-angle, gripper_qpos), got {state.shape[0]}"
        )
    privileged = payload.get("privileged_state")
    if privileged is not None:
        _check_state(state, privileged, model, normalized=False)
        _check_images(
            {**images, "right_wrist_0_rgb": None},
            {"right_wrist_0_rgb": False},
            privileged,
            model,
        )
    return Pi05Request(
        request_id=str(uuid.uuid4()),
        item=PolicyItem(
            image=images["base_0_rgb"], prompt=str(payload["prompt"]), privileged_state=privileged
        ),
        action_horizon=OPENPI_ACTION_HORIZON,
        action_dim=T.LIBERO_ACTION_DIM,
        num_inference_steps=10,
        response_format=None,
    )


def _check_state(
    state: np.ndarray, privileged: dict[str, Any], model: Pi05Model, normalized: bool = True
) -> None:
    robot = privileged.get("robot") or {}
    try:
        truth = T.libero_state(robot["eef_pos"], robot["eef_quat"], robot["gripper_qpos"])
    except (KeyError, TypeError, ValueError):
        return  # no robot state to compare with
    received = (
        T.unnormalize(state, model.stats.state, model.normalization, model.stats.convention)
        if normalized
        else state
    )
    error = np.abs(received - truth)
    if error.max() > STATE_TOLERANCE:
        channel = int(error.argmax())
        how = (
            f"de-normalizes with the model's statistics ({model.stats.source}) to"
            if normalized
            else "is"
        )
        raise Pi05RequestError(
            f"the state does not match the robot's: channel {channel} {how} "
            f"{received[channel]:.4f}, the robot's is {truth[channel]:.4f}. Check "
            "policy.pi05.norm_stats_path (the checkpoint's own statistics), "
            "policy.pi05.normalization and the state layout (eef_pos, axis-angle, gripper_qpos)"
        )


def pi05_image(frame: np.ndarray, size: int) -> np.ndarray:
    """openpi's LIBERO camera image ``uint8[size, size, 3]`` from one raw frame: rotated 180
    degrees and resized with padding (PIL bilinear, zeros centred, as
    ``openpi_client.image_tools.resize_with_pad``)."""
    image = image_check.upright(frame)
    if image.size == (size, size):
        return np.asarray(image)
    ratio = max(image.width / size, image.height / size)
    new_w, new_h = int(image.width / ratio), int(image.height / ratio)
    resized = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", (size, size))
    canvas.paste(resized, (int((size - new_w) / 2), int((size - new_h) / 2)))
    return np.asarray(canvas)


def lerobot_image(frame: np.ndarray) -> np.ndarray:
    """LeRobot's LIBERO camera image (``LiberoProcessorStep``: both axes flipped), uint8,
    unresized (the model resizes)."""
    return np.ascontiguousarray(np.rot90(frame, 2))


def _check_images(
    arrays: dict[str, np.ndarray], masks: dict[str, Any], privileged: dict, model: Pi05Model
) -> None:
    try:
        frames = image_check.camera_frames(privileged)
    except image_check.ImageCheckError as exc:
        raise Pi05RequestError(str(exc)) from exc
    if frames is None:
        return
    agentview, wrist = frames
    if model.layout.lineage == "lerobot":
        _check_lerobot_images(arrays, {"agentview": agentview, "wrist": wrist}, model.layout)
        return
    expected = {
        "base_0_rgb": pi05_image(agentview, model.image_size),
        "left_wrist_0_rgb": pi05_image(wrist, model.image_size),
    }
    convention = (
        "openpi LIBERO: rotated 180 degrees, resized with zero padding to "
        f"{model.image_size}, base = agentview, left wrist = wrist"
    )
    try:
        for key, image in expected.items():
            if key not in arrays or not bool(masks.get(key, True)):
                raise image_check.ImageCheckError(f"image check failed: {key} is missing or masked")
            image_check.compare(arrays[key], image, key, convention)
    except image_check.ImageCheckError as exc:
        raise Pi05RequestError(str(exc)) from exc
    right = arrays.get("right_wrist_0_rgb")
    if bool(masks.get("right_wrist_0_rgb", right is not None)) or (
        right is not None and np.any(right)
    ):
        raise Pi05RequestError(
            "image check failed: right_wrist_0_rgb must be zeros with mask False (openpi's "
            "LIBERO inputs for π0 / π0.5)"
        )


def _check_lerobot_images(
    arrays: dict[str, np.ndarray], frames: dict[str, np.ndarray], layout: Pi05Layout
) -> None:
    """LeRobot's LIBERO images: each camera rotated 180 degrees (``LiberoProcessorStep``), in
    [0, 1] as float32, at the rendered size (the model resizes)."""
    convention = (
        f"LeRobot LIBERO: rotated 180 degrees, float32 in [0, 1], unresized; cameras "
        f"{dict(layout.camera_views)}"
    )
    for key, view in layout.camera_views.items():
        if view is None:
            continue
        received = np.asarray(arrays[key])
        if not np.issubdtype(received.dtype, np.floating) or received.max(initial=0) > 1.0:
            raise Pi05RequestError(
                f"image check failed for {key}: LeRobot's pipeline feeds the model float "
                f"images in [0, 1], the client sent {received.dtype} ({convention})"
            )
        expected = lerobot_image(frames[view])
        try:
            image_check.compare(np.round(received * 255.0), expected, key, convention)
        except image_check.ImageCheckError as exc:
            raise Pi05RequestError(str(exc)) from exc


def model_actions(chunk: np.ndarray, request: Pi05Request, model: Pi05Model) -> np.ndarray:
    """The expert's LIBERO chunk ``[H, 7]`` as the model's normalized ``[H, D]`` float32."""
    normalized = T.normalize(
        chunk, model.stats.actions, model.normalization, model.stats.convention
    )
    actions = np.zeros((request.action_horizon, request.action_dim), dtype=np.float32)
    actions[:, : T.LIBERO_ACTION_DIM] = normalized
    return actions


def output(request: Pi05Request, actions: np.ndarray) -> dict[str, Any]:
    """VLAActionPostprocessStage's payload."""
    return {
        "request_id": request.request_id,
        "actions": actions,
        "parameters": {"num_inference_steps": request.num_inference_steps},
        "timings": {},
    }


def envelope(result: dict[str, Any], model_name: str, *, preserve_numpy: bool) -> dict[str, Any]:
    """protocol.py ``action_generation_response`` for a π0.5 output."""
    actions = np.asarray(result["actions"])
    return {
        "id": result["request_id"],
        "object": "action.generation",
        "created": int(time.time()),
        "model": model_name,
        "data": [
            {
                "index": 0,
                "input_index": 0,
                "candidate_index": 0,
                "action": {
                    "type": "continuous",
                    "dtype": "float32",
                    "shape": list(actions.shape),
                    "values": actions if preserve_numpy else actions.tolist(),
                },
            }
        ],
        "usage": {
            "batch_size": 1,
            "action_horizon": actions.shape[0],
            "action_dim": actions.shape[1],
            "denoise_steps": result["parameters"]["num_inference_steps"],
            "prefix_cache_hit": False,
        },
        "timings": result["timings"],
    }


def metadata(model: Pi05Model, model_name: str, policy: str) -> dict[str, Any]:
    """protocol.py ``action_metadata`` for Pi05PipelineConfig (the parts clients read)."""
    return {
        "object": "action.metadata",
        "model": model_name,
        "model_path": f"reference://{policy}",
        "policy_family": "pi05",
        "input": {
            "image_keys": list(model.layout.camera_keys),
            "image_size": [model.image_size, model.image_size],
            "state_dim": model.state_dim,
        },
        "output": {
            "action_type": "continuous",
            "action_horizon": model.action_horizon,
            "action_dim": model.action_dim,
            "padded_action_dim": model.action_dim,
            "dtype": "float32",
        },
        "defaults": {"num_inference_steps": 10, "prefix_cache": False, "cuda_graph": False},
        "capabilities": {
            "exact_prefix_cache": True,
            "cuda_graph": False,
            "realtime_websocket": False,
            "openpi_websocket": True,
            "batch_inputs": False,
            "multiple_candidates": False,
        },
    }
