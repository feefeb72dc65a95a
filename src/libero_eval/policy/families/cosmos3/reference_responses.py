"""What the Cosmos3 endpoints answer, mirroring SGLang 0.5.23's ``protocol.py``
(``action_generation_response``; ``action_raw_response`` is every family's,
``libero_eval.policy.reference_host.http``) and ``cosmos3.py`` (``cosmos3_action_metadata``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np

from libero_eval.policy.families.cosmos3.sglang_api import (
    ACTION_HORIZON,
    DEFAULT_NUM_INFERENCE_STEPS,
    SUPPORTED_RESOLUTIONS,
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


def action_metadata(
    model_name: str, policy: str, max_batch_size: int, padded_action_dim: int
) -> dict[str, Any]:
    """cosmos3.py ``cosmos3_action_metadata`` for a server of ``policy`` reporting
    ``model_name``."""
    return {
        "object": "action.metadata",
        "model": model_name,
        "model_path": f"reference://{policy}",
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
            "padded_action_dim": padded_action_dim,
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
