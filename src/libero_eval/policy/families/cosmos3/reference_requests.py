"""Decoding and validating a Cosmos3 ``POST /v1/actions/generations`` request: the body
(JSON or msgpack), images and tensors, prompts, domains and privileged states, into a
:class:`GenerationRequest`. It mirrors SGLang 0.5.23's ``protocol.py`` (``_normalize_*``
helpers, ``_action_request_to_observation``) and ``cosmos3.py``
(``build_cosmos3_action_sampling_params``): same order, same error messages, each a
:class:`RequestError` (HTTP 400, ``{"detail": message}``). With the raw camera frames in a
request's privileged state, its images must be Cosmos3's preprocessing of them
(:func:`cosmos3_image`).

Deliberate differences from SGLang, all stricter and all answered with 400: errors SGLang
raises later in its pipeline (unknown ``domain_name``, missing ``raw_action_dim`` for a domain
without a default, ``raw_action_dim`` out of range) are checked up front; bodies that are not
objects, non-numeric parameters and unreadable images are rejected instead of failing with 500;
only ``action_mode="policy"``, the ``libero`` domain and ``raw_action_dim=10`` are served.
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from libero_eval.policy.families.cosmos3.actions import MODEL_ACTION_DIM
from libero_eval.policy.families.cosmos3.sglang_api import (
    ACTION_HORIZON,
    DEFAULT_NUM_INFERENCE_STEPS,
    DEFAULT_SEED,
    EMBODIMENT_TO_DOMAIN_ID,
    EMBODIMENT_TO_RAW_ACTION_DIM,
    LIBERO_DOMAIN_ID,
    RESPONSE_FORMATS,
)
from libero_eval.policy.reference_host import PolicyItem, RequestError, image_check


@dataclass(frozen=True)
class GenerationRequest:
    """A validated ``POST /v1/actions/generations`` request."""

    request_id: str
    items: list[PolicyItem]
    action_horizon: int
    num_frames: int
    num_inference_steps: int
    domain_id: int
    raw_action_dim: int
    response_format: str

    @property
    def batch_size(self) -> int:
        return len(self.items)


def _decode_b64_image(payload: dict[str, Any]) -> Image.Image:
    data = payload.get("b64_json") or payload.get("base64")
    if not data:
        raise RequestError("image payload requires b64_json")
    if isinstance(data, str) and "," in data and data.startswith("data:"):
        data = data.split(",", 1)[1]
    try:
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        return image.convert("RGB")
    except (binascii.Error, UnidentifiedImageError, OSError, TypeError, ValueError) as exc:
        raise RequestError(
            f"image b64_json is not a base64-encoded PNG or JPEG ({exc}); send "
            '{"b64_json": base64.b64encode(png_bytes).decode()} or a data: URI'
        ) from exc


def _decode_tensor_payload(payload: dict[str, Any]) -> Any:
    values = payload.get("values")
    if values is None:
        values = payload.get("data")
    if values is None:
        return payload
    dtype = payload.get("dtype")
    shape = payload.get("shape")
    try:
        array = np.asarray(values, dtype=np.dtype(dtype) if dtype else None)
        if shape is not None:
            array = array.reshape(tuple(shape))
    except (TypeError, ValueError) as exc:
        raise RequestError(
            f"tensor payload with dtype={dtype!r} and shape={shape!r} cannot be decoded: {exc}"
        ) from exc
    return array


def _uint8_pixels(rows: list) -> np.ndarray | None:
    """3-level lists of ints in [0, 255] -> uint8; None if they are not."""
    try:
        height, width, channels = len(rows), len(rows[0]), len(rows[0][0])
        if any(len(row) != width for row in rows):
            return None
        flat = bytes(itertools.chain.from_iterable(itertools.chain.from_iterable(rows)))
    except (TypeError, ValueError):
        return None
    if len(flat) != height * width * channels:
        return None
    return np.frombuffer(flat, dtype=np.uint8).reshape(height, width, channels)


def _pixel_list_to_array(value: list) -> Any:
    """JSON pixel lists (``image.tolist()``) -> numpy; other lists are unchanged."""
    try:
        first = value[0][0][0]
    except (TypeError, IndexError, KeyError):
        return value
    if isinstance(first, bool) or not isinstance(first, int | float):
        return value
    array = _uint8_pixels(value) if isinstance(first, int) else None
    if array is not None:
        return array
    try:
        array = np.asarray(value)
    except ValueError:
        return value
    return array if array.dtype.kind in "iuf" else value


def _normalize_image_value(value: Any) -> Any:
    if isinstance(value, list):
        return _pixel_list_to_array(value)
    if not isinstance(value, dict):
        return value
    if "b64_json" in value or "base64" in value:
        return _decode_b64_image(value)
    if "values" in value or "data" in value:
        return _decode_tensor_payload(value)
    return value


def _normalize_observation(observation: dict[str, Any]) -> dict[str, Any]:
    normalized = dict(observation)
    images = normalized.get("images")
    if isinstance(images, dict):
        normalized["images"] = {
            name: _normalize_image_value(value) for name, value in images.items()
        }
    for name in ("image", "image_path", "input_reference"):
        if name in normalized:
            value = normalized[name]
            normalized[name] = (
                [_normalize_image_value(item) for item in value]
                if isinstance(value, list | tuple)
                else _normalize_image_value(value)
            )
    return normalized


def action_request_to_observation(payload: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``_action_request_to_observation``: the flat observation of a request."""
    if "input" not in payload:
        return _normalize_observation(payload)
    input_payload = payload.get("input") or {}
    if not isinstance(input_payload, dict):
        raise RequestError(f"input must be an object, got {type(input_payload).__name__}")
    observation = dict(input_payload.get("observation") or {})
    if "task" in input_payload:
        observation["prompt"] = input_payload["task"]
    elif "prompt" in input_payload:
        observation["prompt"] = input_payload["prompt"]
    for name in ("images", "state", "noise"):
        if name in input_payload:
            observation[name] = input_payload[name]
    for name in ("image", "image_path", "input_reference", "video", "video_path"):
        if name in input_payload:
            observation[name] = input_payload[name]
    return _normalize_observation(observation)


def _images_from_observation(observation: dict[str, Any]) -> list[Any]:
    """cosmos3.py ``_images_from_observation``, keeping arrays as arrays."""
    image = None
    for name in ("image", "image_path", "input_reference"):
        if name in observation:
            image = observation[name]
            break
    if image is None:
        images = observation.get("images")
        if images is None or (isinstance(images, dict) and not images):
            return []
        if not isinstance(images, dict) or len(images) != 1:
            raise RequestError(
                "Cosmos3 action input accepts one image field; use a list or "
                "a [B, H, W, C] array in that field for batched observations"
            )
        image = next(iter(images.values()))

    if isinstance(image, list | tuple) or (isinstance(image, np.ndarray) and image.ndim == 4):
        images = list(image)
    else:
        images = [image]
    for item in images:
        if not isinstance(item, np.ndarray):
            continue
        if item.dtype != np.uint8:
            raise RequestError("Cosmos3 observation image arrays must use uint8 dtype")
        if item.ndim not in (2, 3):
            raise RequestError(
                "Cosmos3 observation image arrays must have shape [H, W] "
                f"or [H, W, C], got {tuple(item.shape)}"
            )
    return images


def _action_prompt(prompt: Any, batch_size: int) -> list[str]:
    """cosmos3.py ``_action_prompt``, always returning one prompt per image."""
    if isinstance(prompt, str):
        return [prompt] * batch_size
    if not isinstance(prompt, list | tuple) or not prompt:
        raise RequestError("Cosmos3 action prompt must be a string or non-empty list")
    if not all(isinstance(item, str) for item in prompt):
        raise RequestError("Cosmos3 action prompt list must contain only strings")
    prompts = list(prompt)
    if len(prompts) == 1 and batch_size > 1:
        prompts *= batch_size
    if len(prompts) != batch_size:
        raise RequestError(
            "Cosmos3 batched action input requires one prompt per image, got "
            f"{len(prompts)} prompt(s) and {batch_size} image(s)"
        )
    return prompts


def _as_int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"parameters.{name} must be an integer, got {value!r}") from None


def _as_float(value: Any, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RequestError(f"parameters.{name} must be a number, got {value!r}") from None


def _resolve_domain(
    domain_id: Any, domain_name: Any, raw_action_dim: Any, padded: int
) -> tuple[int, int]:
    """SGLang's pipeline-stage domain checks (cosmos3.py ``_resolve_domain_id`` and
    ``_prepare_action_latents``) -> ``(domain_id, raw_action_dim)``."""
    if domain_id is not None:
        domain_id = _as_int(domain_id, "domain_id")
        if domain_id < 0:
            raise RequestError(f"domain_id must be non-negative, got {domain_id}")
    else:
        key = str(domain_name).strip().lower()
        if key not in EMBODIMENT_TO_DOMAIN_ID:
            raise RequestError(
                f"Unknown action domain name {domain_name!r}. "
                f"Valid names: {sorted(EMBODIMENT_TO_DOMAIN_ID)}"
            )
        domain_id = EMBODIMENT_TO_DOMAIN_ID[key]
    if raw_action_dim is None:
        key = str(domain_name).lower().strip()
        if key not in EMBODIMENT_TO_RAW_ACTION_DIM:
            raise RequestError(
                f"No raw action dim for Cosmos3 embodiment {domain_name!r}. Expected one "
                f"of {sorted(EMBODIMENT_TO_RAW_ACTION_DIM)}. Send parameters.raw_action_dim "
                f"(LIBERO: {MODEL_ACTION_DIM})."
            )
        raw_action_dim = EMBODIMENT_TO_RAW_ACTION_DIM[key]
    raw_action_dim = _as_int(raw_action_dim, "raw_action_dim")
    if not 0 < raw_action_dim <= padded:
        raise RequestError(f"raw_action_dim must be in [1, {padded}], got {raw_action_dim}")
    return domain_id, raw_action_dim


def _image_to_rgb(item: Any, index: int) -> np.ndarray:
    """One image of the batch (array, PIL image or local path) -> uint8 [H, W, 3]."""
    where = f"input image {index}"
    if isinstance(item, np.ndarray):
        if item.shape[0] == 0 or item.shape[1] == 0:
            raise RequestError(f"{where} is empty (shape {tuple(item.shape)}); send pixels")
        if item.ndim == 3 and item.shape[2] == 3:
            return np.ascontiguousarray(item)
        try:
            image = Image.fromarray(item[..., 0] if item.ndim == 3 and item.shape[2] == 1 else item)
        except (TypeError, ValueError) as exc:
            raise RequestError(
                f"{where} has shape {tuple(item.shape)}; send [H, W, 3] RGB (or [H, W], "
                f"[H, W, 1], [H, W, 4]) uint8 pixels ({exc})"
            ) from exc
        return np.asarray(image.convert("RGB"))
    if isinstance(item, Image.Image):
        return np.asarray(item.convert("RGB"))
    if isinstance(item, str):
        if item.startswith("data:"):
            return np.asarray(_decode_b64_image({"b64_json": item}))
        path = Path(item)
        if not path.is_file():
            raise RequestError(
                f"{where} is the path {item!r}, which is not a file on the reference server; "
                "send pixels instead (uint8 array, nested lists or {'b64_json': ...})"
            )
        try:
            with Image.open(path) as image:
                return np.asarray(image.convert("RGB"))
        except (UnidentifiedImageError, OSError) as exc:
            raise RequestError(f"{where}: cannot read image file {item!r}: {exc}") from exc
    hint = ""
    if isinstance(item, list):
        hint = (
            "; a top-level list is a batch (as in SGLang), so wrap a single nested-list image "
            "in a list: input_reference=[image]"
        )
    raise RequestError(
        f"{where} is a {type(item).__name__}, not an image: send a uint8 [H, W, 3] array "
        f"(msgpack), nested pixel lists, or {{'b64_json': <base64 PNG/JPEG>}}{hint}"
    )


def _privileged_states(payload: dict[str, Any], batch_size: int) -> list[dict | None]:
    container = payload.get("input") if "input" in payload else payload
    states = (container or {}).get("privileged_state")
    if states is None:
        return [None] * batch_size
    if (
        not isinstance(states, list)
        or len(states) != batch_size
        or not all(state is None or isinstance(state, dict) for state in states)
    ):
        raise RequestError(
            f"input.privileged_state must be a list of {batch_size} objects (one per image, "
            f"or null), got {type(states).__name__}"
            + (f" of length {len(states)}" if isinstance(states, list) else "")
        )
    return states


def cosmos3_image(agentview: np.ndarray, wrist: np.ndarray, width: int, height: int) -> np.ndarray:
    """Cosmos3's LIBERO input image ``uint8[height, width, 3]`` from the raw frames: both
    cameras rotated 180 degrees, side by side with agentview on the left, scaled down keeping
    the aspect (PIL bicubic, never up), reflect-padded bottom and right."""
    left, right = image_check.upright(agentview), image_check.upright(wrist)
    canvas = Image.new("RGB", (left.width + right.width, max(left.height, right.height)))
    canvas.paste(left, (0, 0))
    canvas.paste(right, (left.width, 0))
    scale = min(width / canvas.width, height / canvas.height, 1.0)
    size = (round(canvas.width * scale), round(canvas.height * scale))
    if size != canvas.size:
        canvas = canvas.resize(size, Image.Resampling.BICUBIC)
    content = np.asarray(canvas)
    pad_h, pad_w = height - content.shape[0], width - content.shape[1]
    if pad_h >= content.shape[0] or pad_w >= content.shape[1]:
        return np.pad(content, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return np.pad(content, ((0, pad_h), (0, pad_w), (0, 0)), mode="reflect")


def _check_cosmos3_image(
    image: np.ndarray, state: dict | None, width: int, height: int, index: int
) -> None:
    """With the raw camera frames in the privileged state: the image must be Cosmos3's."""
    try:
        frames = image_check.camera_frames(state)
        if frames is not None:
            image_check.compare(
                image,
                cosmos3_image(*frames, width=width, height=height),
                f"input_reference[{index}]",
                "Cosmos3 LIBERO: both cameras rotated 180 degrees, agentview left, scaled "
                f"down to fit {width}x{height}, reflect-padded bottom and right",
            )
    except image_check.ImageCheckError as exc:
        raise RequestError(str(exc)) from exc


def parse_generation_request(
    payload: Any, max_batch_size: int, padded_action_dim: int
) -> GenerationRequest:
    """Validate a request body as SGLang's Cosmos3 action endpoint does (same order, same
    messages), plus the reference server's own limits (``max_batch_size`` observations,
    ``padded_action_dim`` channels); ``RequestError`` on bad input."""
    if not isinstance(payload, dict):
        raise RequestError(
            f"request body must be an object (JSON object or msgpack map), "
            f"got {type(payload).__name__}"
        )
    for name in ("parameters", "runtime"):
        if payload.get(name) is not None and not isinstance(payload[name], dict):
            raise RequestError(f"{name} must be an object, got {type(payload[name]).__name__}")
    observation = action_request_to_observation(payload)
    parameters = dict(payload.get("parameters") or {})
    runtime = dict(payload.get("runtime") or {})
    options = {**observation, **parameters}

    action_mode = str(options.get("action_mode", "policy")).strip().lower()
    if action_mode == "forward_dynamics":
        raise RequestError("Cosmos3 forward_dynamics produces video; use /v1/videos instead")
    if action_mode not in ("policy", "inverse_dynamics"):
        raise RequestError(
            "Cosmos3 action endpoint supports action_mode='policy' or 'inverse_dynamics'"
        )

    action_horizon = options.get("action_horizon")
    num_frames = options.get("num_frames")
    if action_horizon is None and num_frames is None:
        action_horizon = ACTION_HORIZON
    if action_horizon is not None:
        action_horizon = _as_int(action_horizon, "action_horizon")
        if action_horizon <= 0:
            raise RequestError("action_horizon must be a positive integer")
        expected_num_frames = action_horizon + 1
        if num_frames is not None and _as_int(num_frames, "num_frames") != expected_num_frames:
            raise RequestError(
                "Cosmos3 requires num_frames == action_horizon + 1, got "
                f"num_frames={num_frames}, action_horizon={action_horizon}"
            )
        num_frames = expected_num_frames
    else:
        num_frames = _as_int(num_frames, "num_frames")
        if num_frames <= 1:
            raise RequestError("Cosmos3 action num_frames must be greater than 1")
    if (num_frames - 1) % 4 != 0:
        raise RequestError(
            "Cosmos3 action_horizon must be divisible by 4 so num_frames "
            "is compatible with the temporal VAE"
        )

    images = _images_from_observation(observation)
    video_path = options.get("video_path") or observation.get("video")
    if action_mode == "policy" and not images:
        raise RequestError("Cosmos3 policy input requires an observation image")
    if action_mode == "inverse_dynamics" and video_path is None:
        raise RequestError("Cosmos3 inverse_dynamics input requires an observation video")
    if images and video_path is not None:
        raise RequestError("Cosmos3 action requests accept either an image or a video")
    batch_size = len(images) if images else 1
    if batch_size > max_batch_size:
        raise RequestError(
            f"Cosmos3 action batch size {batch_size} exceeds --batching-max-size={max_batch_size}"
        )

    domain_id = options.get("domain_id")
    domain_name = options.get("domain_name")
    raw_action_dim = options.get("raw_action_dim")
    if domain_id is None and not domain_name:
        raise RequestError("Cosmos3 action requests require domain_name or domain_id")
    if domain_id is not None and not domain_name and raw_action_dim is None:
        raise RequestError("raw_action_dim is required when only domain_id is provided")

    prompt = observation.get("prompt")
    if prompt is None:
        prompt = observation.get("task", "")
    if action_mode != "policy" and not isinstance(prompt, str):
        raise RequestError("Cosmos3 inverse_dynamics prompt must be a string")
    prompts = _action_prompt(prompt, batch_size)

    _as_int(options.get("fps", 5), "fps")
    height = _as_int(options.get("height", 480), "height")
    width = _as_int(options.get("width", 832), "width")
    num_inference_steps = _as_int(
        options.get("num_inference_steps", DEFAULT_NUM_INFERENCE_STEPS), "num_inference_steps"
    )
    _as_float(options.get("guidance_scale", 1.0), "guidance_scale")
    seed = _as_int(options.get("seed", DEFAULT_SEED), "seed")

    domain_id, raw_action_dim = _resolve_domain(
        domain_id, domain_name, raw_action_dim, padded_action_dim
    )

    if action_mode != "policy":
        raise RequestError(
            f"the reference server serves action_mode='policy' only, got {action_mode!r}"
        )
    if domain_id != LIBERO_DOMAIN_ID:
        raise RequestError(
            f"the reference server serves the libero domain only (domain_id "
            f"{LIBERO_DOMAIN_ID}), got domain_id={domain_id}; send domain_name='libero'"
        )
    if raw_action_dim != MODEL_ACTION_DIM:
        raise RequestError(
            f"the reference server returns LIBERO's {MODEL_ACTION_DIM}-channel "
            f"[dxyz, rot6d, gripper] actions; send raw_action_dim={MODEL_ACTION_DIM}, "
            f"got {raw_action_dim}"
        )

    response_format = str(runtime.get("response_format", "envelope")).lower()
    if response_format not in RESPONSE_FORMATS:
        raise RequestError("runtime.response_format must be 'envelope' or 'raw'")

    rgb_images = [_image_to_rgb(item, index) for index, item in enumerate(images)]
    states = _privileged_states(payload, batch_size)
    for index, (image, state) in enumerate(zip(rgb_images, states, strict=True)):
        _check_cosmos3_image(image, state, width, height, index)
    request_id = payload.get("request_id") or payload.get("id") or str(uuid.uuid4())
    return GenerationRequest(
        request_id=str(request_id),
        items=[
            PolicyItem(image=image, prompt=text, privileged_state=state, seed=seed)
            for image, text, state in zip(rgb_images, prompts, states, strict=True)
        ],
        action_horizon=action_horizon if action_horizon is not None else num_frames - 1,
        num_frames=num_frames,
        num_inference_steps=num_inference_steps,
        domain_id=domain_id,
        raw_action_dim=raw_action_dim,
        response_format=response_format,
    )
