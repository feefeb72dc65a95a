"""The built-in reference policy server: SGLang's Cosmos3 action API on a CPU.

It speaks the part of SGLang 0.5.23's action API that our client uses
(``sglang/multimodal_gen/runtime/entrypoints/action/{api.py,protocol.py,cosmos3.py}``):

- ``GET /health``: 200 ``{"status": "ok"}`` once the policy is built, 503 before (or if that
  failed).
- ``GET /v1/actions/metadata``: the structure of ``cosmos3_action_metadata``.
- ``POST /v1/actions/generations``: JSON, or msgpack when Content-Type contains ``msgpack``.
  The request is parsed and validated as ``_action_request_to_observation`` and
  ``build_cosmos3_action_sampling_params`` do, with the same error messages (HTTP 400,
  ``{"detail": message}``); the answer is ``action_generation_response`` (``envelope``) or
  ``action_raw_response`` (``raw``), msgpack when Content-Type or Accept contains ``msgpack``.
- ``GET /v1/stats`` (ours): requests, items, busy time and uptime, for duty-cycle benchmarks.

A server policy (``reference/policies``) turns each image into a LIBERO 7-D chunk ``[H, 7]``;
the server normalizes it into the model's 10-channel form with the action stats file, so the
client sees what a Cosmos3 server without ``action_stats_path`` returns.

Deliberate differences from SGLang, all stricter and all answered with 400: errors SGLang
raises later in its pipeline (unknown ``domain_name``, missing ``raw_action_dim`` for a domain
without a default, ``raw_action_dim`` out of range) are checked up front; bodies that are not
objects, non-numeric parameters and unreadable images are rejected instead of failing with 500;
only ``action_mode="policy"``, the ``libero`` domain and ``raw_action_dim=10`` are served.
Values are zero-padded up to ``padded_action_dim`` channels (SGLang 0.5.23 itself returns
exactly ``raw_action_dim`` channels; padding lets tests exercise a client's slicing).
Like SGLang, ``runtime.output_format`` does not matter for Cosmos3: JSON answers carry lists,
msgpack answers numpy arrays.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import io
import itertools
import json
import logging
import math
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from PIL import Image, UnidentifiedImageError

from libero_eval.policy import codec
from libero_eval.policy.actions import (
    LIBERO_ACTION_DIM,
    MODEL_ACTION_DIM,
    ActionStats,
    libero_to_model_chunk,
    load_action_stats,
    stats_block_for,
)
from libero_eval.reference import image_check, pi05
from libero_eval.reference.policies import (
    PolicyItem,
    ServerPolicy,
    make_server_policy,
    server_policy_class,
)

logger = logging.getLogger("libero_eval.reference.server")

ACTION_HORIZON = 16
LIBERO_DOMAIN_NAME = "libero"
# SGLang 0.5.23 pipelines_core/stages/model_specific_stages/cosmos3_action.py.
EMBODIMENT_TO_DOMAIN_ID: dict[str, int] = {
    "no_action": 0,
    "av": 1,
    "camera_pose": 2,
    "hand_pose": 3,
    "pusht": 4,
    "libero": 5,
    "umi": 6,
    "bridge_orig_lerobot": 7,
    "droid_lerobot": 8,
    "robomind-franka": 8,
    "galbot": 9,
    "robomind-franka-dual": 12,
    "robomind-ur": 13,
    "agibotworld": 15,
    "agibot_gear_gripper": 15,
    "agibot_gear_gripper_ext": 15,
    "fractal": 20,
}
EMBODIMENT_TO_RAW_ACTION_DIM: dict[str, int] = {
    "av": 9,
    "camera_pose": 9,
    "pusht": 2,
    "umi": 10,
    "bridge_orig_lerobot": 10,
    "droid_lerobot": 10,
    "robomind-franka": 10,
    "robomind-franka-dual": 20,
    "robomind-ur": 10,
    "agibotworld": 29,
    "fractal": 10,
}
LIBERO_DOMAIN_ID = EMBODIMENT_TO_DOMAIN_ID[LIBERO_DOMAIN_NAME]
# SGLang 0.5.23 configs/sample/cosmos3.py, Cosmos3SamplingParams defaults.
SUPPORTED_RESOLUTIONS = [[1280, 720], [720, 1280], [832, 480], [480, 832], [1024, 1024], [640, 640]]
DEFAULT_NUM_INFERENCE_STEPS = 35
DEFAULT_SEED = 42
RESPONSE_FORMATS = ("envelope", "raw")
FAMILIES = ("cosmos3", "pi05")


class RequestError(ValueError):
    """A request the server rejects with HTTP 400."""


@dataclass(frozen=True, kw_only=True)
class ReferenceServerSettings:
    """How the reference server behaves; see ``python -m libero_eval.reference.server -h``."""

    action_stats_path: Path
    policy: str = "hold"
    policy_kwargs: Mapping[str, Any] = field(default_factory=dict)
    normalization: str = "quantile_rot"
    max_batch_size: int = 8
    padded_action_dim: int = MODEL_ACTION_DIM
    latency_fixed_s: float = 0.0
    latency_per_item_s: float = 0.0
    model_name: str = "reference-hold"
    family: str = "cosmos3"  # or "pi05": SGLang's π0.5 API (reference/pi05.py)
    norm_stats_path: Path | None = None  # π0.5: the model's own statistics

    def __post_init__(self) -> None:
        object.__setattr__(self, "action_stats_path", Path(self.action_stats_path))
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {list(FAMILIES)}, got {self.family!r}")
        if self.family == "pi05" and self.norm_stats_path is None:
            raise ValueError("family pi05 needs norm_stats_path (the model's own statistics)")
        stats_block_for(self.normalization)  # raises for unknown names
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.padded_action_dim < MODEL_ACTION_DIM:
            raise ValueError(
                f"padded_action_dim must be >= {MODEL_ACTION_DIM} (the LIBERO model action has "
                f"{MODEL_ACTION_DIM} channels), got {self.padded_action_dim}"
            )
        for name in ("latency_fixed_s", "latency_per_item_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 seconds, got {value}")


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


# --------------------------------------------------------------------------------------------
# Request parsing, mirroring SGLang's protocol.py (_normalize_* helpers,
# _action_request_to_observation) and cosmos3.py (build_cosmos3_action_sampling_params).
# --------------------------------------------------------------------------------------------


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


def _check_cosmos3_image(
    image: np.ndarray, state: dict | None, width: int, height: int, index: int
) -> None:
    """With the raw camera frames in the privileged state: the image must be Cosmos3's."""
    try:
        frames = image_check.camera_frames(state)
        if frames is not None:
            image_check.compare(
                image,
                image_check.cosmos3_image(*frames, width=width, height=height),
                f"input_reference[{index}]",
                "Cosmos3 LIBERO: both cameras rotated 180 degrees, agentview left, scaled "
                f"down to fit {width}x{height}, reflect-padded bottom and right",
            )
    except image_check.ImageCheckError as exc:
        raise RequestError(str(exc)) from exc


def parse_generation_request(payload: Any, settings: ReferenceServerSettings) -> GenerationRequest:
    """Validate a request body as SGLang's Cosmos3 action endpoint does (same order, same
    messages), plus the reference server's own limits; ``RequestError`` on bad input."""
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
    if batch_size > settings.max_batch_size:
        raise RequestError(
            f"Cosmos3 action batch size {batch_size} exceeds "
            f"--batching-max-size={settings.max_batch_size}"
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
        domain_id, domain_name, raw_action_dim, settings.padded_action_dim
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


# --------------------------------------------------------------------------------------------
# Responses, mirroring protocol.py action_generation_response / action_raw_response
# --------------------------------------------------------------------------------------------


def generation_envelope(
    output: dict[str, Any], model_name: str, *, preserve_numpy: bool
) -> dict[str, Any]:
    """``action_generation_response`` for one model output (``actions`` [H, D] or [B, H, D])."""
    action_array = np.asarray(output["actions"])
    if action_array.ndim == 2:
        action_array = action_array[None]
    data = []
    for input_index, action_values in enumerate(action_array):
        action = {
            "type": "continuous",
            "dtype": "float32",
            "shape": list(action_values.shape),
            "values": action_values if preserve_numpy else action_values.tolist(),
        }
        for name in ("action_mode", "domain_id", "raw_action_dim"):
            if output.get(name) is not None:
                action[name] = output[name]
        data.append(
            {
                "index": input_index,
                "input_index": input_index,
                "candidate_index": 0,
                "action": action,
            }
        )
    action_shape = data[0]["action"]["shape"]
    return {
        "id": output.get("request_id") or f"act_{uuid.uuid4().hex}",
        "object": "action.generation",
        "created": int(time.time()),
        "model": model_name,
        "data": data,
        "usage": {
            "batch_size": len(data),
            "action_horizon": action_shape[0],
            "action_dim": action_shape[1],
            "denoise_steps": output["parameters"]["num_inference_steps"],
            "prefix_cache_hit": False,
        },
    }


def raw_response(output: dict[str, Any], *, preserve_numpy: bool) -> dict[str, Any]:
    """``action_raw_response``: the model output itself."""
    response = dict(output)
    if not preserve_numpy:
        response["actions"] = np.asarray(output["actions"]).tolist()
    return response


def wants_msgpack(request: Request) -> bool:
    """api.py ``_wants_msgpack``: msgpack in Content-Type or Accept."""
    content_type = request.headers.get("content-type", "").lower()
    accept = request.headers.get("accept", "").lower()
    return "msgpack" in content_type or "msgpack" in accept


def decode_body(body: bytes, content_type: str) -> Any:
    """The request body as Python objects: msgpack when Content-Type says so, JSON otherwise."""
    if "multipart/form-data" in content_type:
        raise RequestError(
            "multipart/form-data uploads are not supported by the reference server; "
            "send a JSON object or an application/msgpack map"
        )
    if "msgpack" in content_type:
        try:
            return codec.unpack(body)
        except ValueError as exc:
            raise RequestError(f"request body is not valid msgpack: {exc}") from exc
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(
            f"request body is not valid JSON ({exc}); send a JSON object, or msgpack with "
            "Content-Type: application/msgpack"
        ) from exc


def action_metadata(settings: ReferenceServerSettings) -> dict[str, Any]:
    """cosmos3.py ``cosmos3_action_metadata`` for this server."""
    max_batch_size = settings.max_batch_size
    return {
        "object": "action.metadata",
        "model": settings.model_name,
        "model_path": f"reference://{settings.policy}",
        "policy_family": "cosmos3",
        "input": {
            "modalities": ["image", "video"],
            "supported_resolutions": [list(size) for size in SUPPORTED_RESOLUTIONS],
            "state_dim": None,
        },
        "output": {
            "action_type": "continuous",
            "action_horizon": ACTION_HORIZON,
            "action_dim": None,
            "padded_action_dim": settings.padded_action_dim,
            "dtype": "float32",
        },
        "runtime": {
            "parallelism": {
                "num_gpus": 1,
                "tp_size": 1,
                "sp_degree": 1,
                "ulysses_degree": 1,
                "ring_degree": 1,
            }
        },
        "defaults": {
            "action_mode": "policy",
            "action_horizon": ACTION_HORIZON,
            "num_inference_steps": DEFAULT_NUM_INFERENCE_STEPS,
            "height": 480,
            "width": 832,
            "fps": 5,
        },
        "capabilities": {
            "action_modes": ["policy", "inverse_dynamics"],
            "realtime_websocket": True,
            "openpi_websocket": False,
            "batch_inputs": max_batch_size > 1,
            "max_batch_size": max_batch_size,
            "batched_action_modes": ["policy"],
            "multiple_candidates": False,
        },
    }


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class PolicyOutputError(RuntimeError):
    """The server policy returned something other than one [H, 7] chunk per item."""


class ReferenceServer:
    """Policy, stats and the one-at-a-time execution with its latency model and counters."""

    def __init__(self, settings: ReferenceServerSettings) -> None:
        self.settings = settings
        server_policy_class(settings.policy)  # unknown names fail now, not in the background
        self.stats: ActionStats = load_action_stats(
            settings.action_stats_path, stats_block_for(settings.normalization)
        )
        self.pi05_model: pi05.Pi05Model | None = None
        if settings.family == "pi05":
            assert settings.norm_stats_path is not None
            self.pi05_model = pi05.Pi05Model.load(settings.norm_stats_path)
        self.policy: ServerPolicy | None = None
        self.load_error: str | None = None
        self.started = time.monotonic()
        self.requests = 0
        self.items = 0
        self.rejected = 0
        self.busy_s = 0.0
        self.queue_wait_s = 0.0
        self._lock = asyncio.Lock()

    @property
    def ready(self) -> bool:
        return self.policy is not None

    def load_policy(self) -> None:
        """Build the policy (may be slow); /health turns 200 when done."""
        try:
            policy = make_server_policy(self.settings.policy, **self.settings.policy_kwargs)
        except Exception as exc:
            self.load_error = f"building server policy {self.settings.policy!r} failed: {exc!r}"
            logger.exception(self.load_error)
            return
        self.policy = policy
        logger.info("server policy %r ready", self.settings.policy)

    def latency_s(self, batch_size: int) -> float:
        return self.settings.latency_fixed_s + self.settings.latency_per_item_s * batch_size

    def compute_actions(self, request: GenerationRequest) -> np.ndarray:
        """Normalized model actions ``float32[B, H, padded_action_dim]`` for the request."""
        assert self.policy is not None
        horizon = request.action_horizon
        chunks = self.policy.act(request.items, horizon)
        if not isinstance(chunks, list | tuple) or len(chunks) != request.batch_size:
            raise PolicyOutputError(
                f"server policy {self.settings.policy!r} returned "
                f"{len(chunks) if isinstance(chunks, list | tuple) else type(chunks).__name__} "
                f"chunks for {request.batch_size} items; it must return one per item"
            )
        actions = np.zeros(
            (request.batch_size, horizon, self.settings.padded_action_dim), dtype=np.float32
        )
        for index, chunk in enumerate(chunks):
            chunk = np.asarray(chunk, dtype=np.float64)
            if chunk.shape != (horizon, LIBERO_ACTION_DIM) or not np.all(np.isfinite(chunk)):
                raise PolicyOutputError(
                    f"server policy {self.settings.policy!r} returned a chunk of shape "
                    f"{chunk.shape} for item {index}; it must be finite [{horizon}, 7]"
                )
            actions[index, :, :MODEL_ACTION_DIM] = libero_to_model_chunk(chunk, self.stats)
        return actions

    async def _serialized(self, compute, batch_size: int) -> tuple[np.ndarray, float, float]:
        """Run `compute()` serialized with all other requests, taking at least the modelled
        latency of `batch_size` items; counts it. Returns (actions, latency, queued) seconds."""
        arrived = time.perf_counter()
        async with self._lock:
            started = time.perf_counter()
            try:
                actions = await asyncio.to_thread(compute)
                remaining = self.latency_s(batch_size) - (time.perf_counter() - started)
                if remaining > 0:
                    await asyncio.sleep(remaining)
            finally:
                finished = time.perf_counter()
                self.busy_s += finished - started
                self.queue_wait_s += started - arrived
        self.requests += 1
        self.items += batch_size
        return actions, finished - started, started - arrived

    async def generate(self, request: GenerationRequest) -> dict[str, Any]:
        """Run one request, serialized with all others, taking at least the modelled latency;
        returns the SGLang pipeline output dict."""
        actions, latency, queued = await self._serialized(
            lambda: self.compute_actions(request), request.batch_size
        )
        logger.info(
            "generation request_id=%s batch=%d latency=%.3fs queued=%.3fs",
            request.request_id,
            request.batch_size,
            latency,
            queued,
        )
        return {
            "request_id": request.request_id,
            # SGLang squeezes a batch of one to [H, D] (cosmos3.py decoding stage).
            "actions": actions[0] if request.batch_size == 1 else actions,
            "action_mode": "policy",
            "domain_id": request.domain_id,
            "raw_action_dim": request.raw_action_dim,
            "parameters": {
                "num_inference_steps": request.num_inference_steps,
                "num_frames": request.num_frames,
            },
        }

    def compute_pi05_actions(
        self, request: pi05.Pi05Request, model_space: bool = True
    ) -> np.ndarray:
        """The expert's chunk in π0.5 model space ``float32[H, D]`` (or as LIBERO actions
        ``[H, 7]``, what openpi's server answers after its own transforms)."""
        assert self.policy is not None and self.pi05_model is not None
        chunks = self.policy.act([request.item], request.action_horizon)
        chunk = np.asarray(chunks[0] if len(chunks) == 1 else chunks, dtype=np.float64)
        if chunk.shape != (request.action_horizon, LIBERO_ACTION_DIM) or not np.all(
            np.isfinite(chunk)
        ):
            raise PolicyOutputError(
                f"server policy {self.settings.policy!r} returned a chunk of shape "
                f"{chunk.shape}; it must be finite [{request.action_horizon}, 7]"
            )
        if not model_space:
            return chunk
        return pi05.model_actions(chunk, request, self.pi05_model)

    async def generate_pi05(
        self, request: pi05.Pi05Request, model_space: bool = True
    ) -> dict[str, Any]:
        """One π0.5 request, serialized like :meth:`generate`; SGLang's π0.5 output dict."""
        actions, _latency, _queued = await self._serialized(
            lambda: self.compute_pi05_actions(request, model_space), 1
        )
        return pi05.output(request, actions)

    def counters(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "items": self.items,
            "rejected": self.rejected,
            "busy_s": self.busy_s,
            "queue_wait_s": self.queue_wait_s,
            "uptime_s": time.monotonic() - self.started,
            "policy": self.settings.policy,
            "max_batch_size": self.settings.max_batch_size,
            "latency_fixed_s": self.settings.latency_fixed_s,
            "latency_per_item_s": self.settings.latency_per_item_s,
        }


def create_app(settings: ReferenceServerSettings) -> FastAPI:
    """The FastAPI app; the stats file and policy name are checked now, the policy is built in
    a background thread at startup (``/health`` answers 503 until it is ready)."""
    server = ReferenceServer(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = threading.Thread(target=server.load_policy, name="policy-loader", daemon=True)
        loader.start()
        yield

    app = FastAPI(title="libero_eval reference policy server", lifespan=lifespan)
    app.state.reference_server = server

    @app.get("/health")
    async def health() -> Response:
        if server.ready:
            return JSONResponse({"status": "ok"})
        if server.load_error:
            return JSONResponse({"status": "failed", "detail": server.load_error}, 503)
        return JSONResponse({"status": "starting"}, 503)

    if settings.family == "pi05":
        _add_pi05_routes(app, server)
        return app

    @app.get("/v1/actions/metadata")
    async def metadata() -> Response:
        return JSONResponse(action_metadata(settings))

    @app.get("/v1/stats")
    async def stats() -> Response:
        return JSONResponse(server.counters())

    @app.post("/v1/actions/generations")
    async def create_action_generation(request: Request) -> Response:
        if not server.ready:
            raise HTTPException(
                status_code=503, detail=server.load_error or "server policy is not ready yet"
            )
        msgpack_answer = wants_msgpack(request)
        try:
            payload = decode_body(await request.body(), request.headers.get("content-type", ""))
            generation = parse_generation_request(payload, settings)
        except RequestError as exc:
            server.rejected += 1
            logger.info("generation rejected (400): %s", exc)
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        try:
            output = await server.generate(generation)
        except PolicyOutputError as exc:
            logger.error("generation failed (500): %s", exc)
            raise HTTPException(status_code=500, detail=str(exc)) from exc
        except Exception as exc:
            logger.exception("generation failed (500)")
            detail = f"server policy {settings.policy!r} failed: {exc!r}"
            raise HTTPException(status_code=500, detail=detail) from exc
        if generation.response_format == "raw":
            response = raw_response(output, preserve_numpy=msgpack_answer)
        else:
            response = generation_envelope(
                output, settings.model_name, preserve_numpy=msgpack_answer
            )
        if msgpack_answer:
            return Response(content=codec.pack(response), media_type=codec.MSGPACK_CONTENT_TYPE)
        return JSONResponse(response)

    return app


def _add_pi05_routes(app: FastAPI, server: ReferenceServer) -> None:
    """SGLang's π0.5 endpoints: metadata, POST generations and the /openpi/policy websocket."""
    settings, model = server.settings, server.pi05_model
    assert model is not None

    @app.get("/v1/stats")
    async def stats() -> Response:
        return JSONResponse(server.counters())

    @app.get("/v1/actions/metadata")
    async def metadata() -> Response:
        return JSONResponse(pi05.metadata(model, settings.model_name, settings.policy))

    async def run(payload: Any, websocket: bool) -> dict[str, Any]:
        if not server.ready:
            raise PolicyOutputError(server.load_error or "server policy is not ready yet")
        request = pi05.parse_request(payload, model, websocket=websocket)
        return await server.generate_pi05(request)

    @app.post("/v1/actions/generations")
    async def create_action_generation(request: Request) -> Response:
        if not server.ready:
            raise HTTPException(503, detail=server.load_error or "server policy is not ready yet")
        msgpack_answer = wants_msgpack(request)
        try:
            payload = decode_body(await request.body(), request.headers.get("content-type", ""))
            result = await run(payload, websocket=False)
        except (RequestError, pi05.Pi05RequestError) as exc:
            server.rejected += 1
            logger.info("generation rejected (400): %s", exc)
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        except Exception as exc:
            logger.exception("generation failed (500)")
            raise HTTPException(500, detail=f"server policy failed: {exc!r}") from exc
        runtime = payload.get("runtime") or {}
        if str(runtime.get("response_format", "envelope")).lower() == "raw":
            response = raw_response(result, preserve_numpy=msgpack_answer)
        else:
            response = pi05.envelope(result, settings.model_name, preserve_numpy=msgpack_answer)
        if msgpack_answer:
            return Response(content=codec.pack(response), media_type=codec.MSGPACK_CONTENT_TYPE)
        return JSONResponse(response)

    @app.get("/healthz")
    async def healthz() -> Response:  # openpi's readiness path
        return Response("OK\n" if server.ready else "starting\n", 200 if server.ready else 503)

    @app.websocket("/")
    async def openpi_serve_policy(websocket: WebSocket) -> None:
        """openpi's ``websocket_policy_server.py``: metadata, then the raw LIBERO observation
        in and ``{"actions": [10, 7]}`` out; on failure the traceback as a TEXT frame and
        close code 1011."""
        await websocket.accept()
        await websocket.send_bytes(codec.pack({"reference_policy": settings.policy}))
        while True:
            try:
                frame = await websocket.receive_bytes()
            except WebSocketDisconnect:
                return
            try:
                started = time.monotonic()
                if not server.ready:
                    raise PolicyOutputError(server.load_error or "server policy is not ready")
                request = pi05.parse_openpi_request(codec.unpack(frame), model)
                result = await server.generate_pi05(request, model_space=False)
                answer = {
                    "actions": result["actions"],
                    "server_timing": {"infer_ms": (time.monotonic() - started) * 1000},
                }
                await websocket.send_bytes(codec.pack(answer))
            except WebSocketDisconnect:
                return
            except Exception as exc:  # noqa: BLE001 - reported to the client, then closed
                server.rejected += 1
                await websocket.send_text(f"Traceback (reference server):\n{exc!r}")
                await websocket.close(code=1011, reason="Internal server error")
                return

    @app.websocket("/openpi/policy")
    async def openpi_policy(websocket: WebSocket) -> None:
        """ws_utils.run_action_msgpack_ws: metadata, then one answer per frame; an error
        frame ``{"error": ...}`` and close code 1011 on failure."""
        await websocket.accept()
        await websocket.send_bytes(
            codec.pack(pi05.metadata(model, settings.model_name, settings.policy))
        )
        while True:
            try:
                frame = await websocket.receive_bytes()
            except WebSocketDisconnect:
                return
            try:
                started = time.monotonic()
                result = await run(codec.unpack(frame), websocket=True)
                result["server_timing"] = {"infer_ms": (time.monotonic() - started) * 1000}
                await websocket.send_bytes(codec.pack(result))
            except WebSocketDisconnect:
                return
            except Exception as exc:  # noqa: BLE001 - reported to the client, then closed
                server.rejected += 1
                logger.info("websocket request failed: %s", exc)
                await websocket.send_bytes(codec.pack({"error": f"{type(exc).__name__}: {exc}"}))
                await websocket.close(code=1011, reason="Internal server error")
                return


@contextlib.contextmanager
def serve_in_thread(
    settings: ReferenceServerSettings,
    host: str = "127.0.0.1",
    *,
    wait_ready: bool = True,
    timeout_s: float = 10.0,
) -> Iterator[str]:
    """Serve ``create_app(settings)`` with uvicorn in a daemon thread on a free port of ``host``;
    yields the base URL (``http://host:port``) and stops the server on exit.

    With ``wait_ready`` it returns only once ``/health`` would answer 200.
    """
    app = create_app(settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"reference-server-{port}", daemon=True
    )
    thread.start()
    reference: ReferenceServer = app.state.reference_server
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started or (wait_ready and not reference.ready):
            if not thread.is_alive() or reference.load_error or time.monotonic() > deadline:
                raise RuntimeError(
                    f"reference server on {host}:{port} did not start within {timeout_s} s"
                    + (f": {reference.load_error}" if reference.load_error else "")
                )
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m libero_eval.reference.server",
        description="Serve a reference LIBERO policy over SGLang's Cosmos3 action API.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="port (default 30000)")
    parser.add_argument("--policy", default="hold", help="server policy name (default hold)")
    parser.add_argument(
        "--policy-kwargs",
        default="{}",
        help="JSON object of keyword arguments for the policy constructor (default {})",
    )
    parser.add_argument(
        "--action-stats", required=True, type=Path, help="Cosmos3 LIBERO action stats JSON"
    )
    parser.add_argument(
        "--normalization",
        default="quantile_rot",
        help="quantile_rot (stats block global_raw) or quantile (global)",
    )
    parser.add_argument("--max-batch-size", type=int, default=8, help="like --batching-max-size")
    parser.add_argument(
        "--padded-action-dim",
        type=int,
        default=MODEL_ACTION_DIM,
        help=f"channels per action row, zero-padded beyond {MODEL_ACTION_DIM}",
    )
    parser.add_argument("--latency-fixed-s", type=float, default=0.0, help="per-request latency")
    parser.add_argument("--latency-per-item-s", type=float, default=0.0, help="per-image latency")
    parser.add_argument("--model-name", default="reference-hold", help="reported model name")
    parser.add_argument(
        "--family",
        default="cosmos3",
        choices=FAMILIES,
        help="model family whose SGLang API to serve (default cosmos3)",
    )
    parser.add_argument(
        "--norm-stats", type=Path, default=None, help="π0.5: the model's statistics file"
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; exit status 2 on bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        policy_kwargs = json.loads(args.policy_kwargs)
        if not isinstance(policy_kwargs, dict):
            raise ValueError(f"--policy-kwargs must be a JSON object, got {args.policy_kwargs!r}")
        settings = ReferenceServerSettings(
            action_stats_path=args.action_stats,
            policy=args.policy,
            policy_kwargs=policy_kwargs,
            normalization=args.normalization,
            max_batch_size=args.max_batch_size,
            padded_action_dim=args.padded_action_dim,
            latency_fixed_s=args.latency_fixed_s,
            latency_per_item_s=args.latency_per_item_s,
            model_name=args.model_name,
            family=args.family,
            norm_stats_path=args.norm_stats,
        )
        logging.basicConfig(
            level=args.log_level.upper(),
            stream=sys.stderr,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
        app = create_app(settings)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    uvicorn.run(app, host=args.host, port=args.port, access_log=False, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
