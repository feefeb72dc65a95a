"""What the Cosmos3 endpoints answer, mirroring SGLang 0.5.23's ``protocol.py``
(``action_generation_response``, ``action_raw_response``), ``api.py`` (msgpack when asked)
and ``cosmos3.py`` (``cosmos3_action_metadata``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from fastapi import Request

from libero_eval.reference.settings import (
    ACTION_HORIZON,
    DEFAULT_NUM_INFERENCE_STEPS,
    SUPPORTED_RESOLUTIONS,
    ReferenceServerSettings,
)


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
