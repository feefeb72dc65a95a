"""π0.5 adapter: openpi's LIBERO transforms on the client, three ways to reach a server.

``policy.pi05.api`` picks the server and where the transforms run:

- ``sglang_http``: SGLang 0.5.23 ``POST /v1/actions/generations`` (``Pi05Pipeline``). The body is
  SGLang's envelope ``{"request_id", "input": {"prompt", "observation": {"images",
  "image_masks", "state"}}, "parameters": {"action_horizon", "action_dim",
  "num_inference_steps"}, "runtime"}`` (``entrypoints/action/protocol.py``
  ``_action_request_to_observation`` / ``_build_action_model_sampling_params``).
- ``sglang_websocket``: SGLang's ``/openpi/policy`` websocket (``entrypoints/action/openpi.py``):
  the same observation as one flat msgpack map, ``actions`` back as a numpy array.
- ``openpi_websocket``: openpi's own ``scripts/serve_policy.py``: the raw observation
  (``observation/image``, ``observation/wrist_image``, ``observation/state`` (8), ``prompt``)
  as ``examples/libero/main.py`` sends it; the server normalizes and answers ``actions`` [N, 7].

With SGLang the client does what openpi's server would (SGLang normalizes nothing): images
rotated and resized with padding to 224, the right wrist zeros with mask False, the 8-D state
normalized with the checkpoint's statistics and zero-padded to the model's state dim (SGLang
discretizes it into the prompt), and the ``[H, D]`` model-space answer de-normalized, cut to
the first 7 channels and to ``replan_steps`` rows. SGLang takes one observation per request
(metadata ``capabilities.batch_inputs: false``); throughput comes from requests in flight.
"""

from __future__ import annotations

import base64
import hashlib
import io
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from libero_eval.policy import openpi_transforms as T
from libero_eval.policy.adapters.base import Observation, PolicyAdapter
from libero_eval.policy.client import PolicyResponseError

APIS = ("sglang_http", "sglang_websocket", "openpi_websocket")
DEFAULTS: dict[str, Any] = {
    "api": "sglang_http",
    "norm_stats_path": "config/stats/pi05_libero_norm_stats.json",
    "normalization": "quantile",
    "pad_state_to": 32,
    "action_horizon": 50,
    "model_action_dim": 32,
    "num_inference_steps": 10,
    "replan_steps": 5,
    "image_size": 224,
    "wire_format": "msgpack",
    "response_format": "envelope",
}
CHOICES = {
    "api": APIS,
    "normalization": ("quantile", "zscore"),
    "wire_format": ("msgpack", "json"),
    "response_format": ("envelope", "raw"),
}
_POSITIVE_INTS = ("action_horizon", "model_action_dim", "num_inference_steps", "replan_steps")


def _png_base64(image: np.ndarray) -> dict[str, str]:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return {"b64_json": base64.b64encode(buffer.getvalue()).decode("ascii")}


def _pi05_settings(settings: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(settings, dict):
        raise ValueError(f"policy settings must be a mapping, got {type(settings).__name__}")
    block = settings.get("pi05", settings)
    if not isinstance(block, dict):
        raise ValueError(f"policy.pi05 must be a mapping, got {type(block).__name__}")
    unknown = sorted(set(block) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown π0.5 setting(s) {', '.join('policy.pi05.' + k for k in unknown)}; "
            f"known: {sorted(DEFAULTS)}"
        )
    merged = {**DEFAULTS, **block}
    for key, allowed in CHOICES.items():
        if merged[key] not in allowed:
            raise ValueError(
                f"policy.pi05.{key} must be one of {list(allowed)}, got {merged[key]!r}"
            )
    for key in (*_POSITIVE_INTS, "image_size"):
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"policy.pi05.{key} must be an integer >= 1, got {value!r}")
    pad = merged["pad_state_to"]
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 8):
        raise ValueError(
            f"policy.pi05.pad_state_to must be null or an integer >= 8 (LIBERO's state has 8 "
            f"entries), got {pad!r}"
        )
    if merged["model_action_dim"] < T.LIBERO_ACTION_DIM:
        raise ValueError(
            f"policy.pi05.model_action_dim must be >= {T.LIBERO_ACTION_DIM}, got "
            f"{merged['model_action_dim']}"
        )
    if merged["replan_steps"] > merged["action_horizon"]:
        raise ValueError(
            f"policy.pi05.replan_steps ({merged['replan_steps']}) cannot exceed "
            f"policy.pi05.action_horizon ({merged['action_horizon']})"
        )
    return merged


class Pi05Adapter(PolicyAdapter):
    """π0.5 on LIBERO with openpi's transforms (see the module docstring)."""

    family: ClassVar[str] = "pi05"

    def __init__(self, settings: dict[str, Any]):
        s = _pi05_settings(settings)
        self._pi05 = dict(settings.get("pi05", settings))  # as configured (the fingerprint's)
        self.api: str = s["api"]
        self.normalization: str = s["normalization"]
        self.pad_state_to: int | None = s["pad_state_to"]
        self.action_horizon: int = s["action_horizon"]
        self.model_action_dim: int = s["model_action_dim"]
        self.num_inference_steps: int = s["num_inference_steps"]
        self.replan_steps: int = s["replan_steps"]
        self.image_size: int = s["image_size"]
        self.response_format: str = s["response_format"]
        if self.api == "sglang_http":
            self.connection, self.wire_format = "http", s["wire_format"]
            self.health_path = "/health"
        else:
            self.connection, self.wire_format = "websocket", "msgpack"
            sglang = self.api == "sglang_websocket"
            self.websocket_path = "/openpi/policy" if sglang else ""
            self.health_path = "/health" if sglang else "/healthz"
        self.stats: T.NormStats | None = None
        self.stats_sha256: str | None = None
        if self.api != "openpi_websocket":  # openpi's server normalizes with its own stats
            try:
                self.stats = T.load_norm_stats(s["norm_stats_path"])
                T.check_stats(
                    self.stats, self.normalization, T.LIBERO_STATE_DIM, T.LIBERO_ACTION_DIM
                )
            except (OSError, ValueError) as exc:
                raise ValueError(f"policy.pi05.norm_stats_path: {exc}") from exc
            self.stats_sha256 = hashlib.sha256(self.stats.source.read_bytes()).hexdigest()

    # ---------------------------------------------------------------- requests

    def statistics(self) -> dict[str, str | None]:
        if self.stats is None:  # openpi's server normalizes with its own statistics
            return {"path": None, "sha256": None}
        return {"path": str(self.stats.source), "sha256": self.stats_sha256}

    def outcome_settings(self) -> dict[str, Any]:
        pi05 = {
            k: v
            for k, v in self._pi05.items()
            if k not in ("wire_format", "response_format")  # transport only
        }
        return {"family": "pi05", "pi05": {**pi05, "norm_stats_path": self.stats_sha256}}

    def prompt_key(self, obs: Observation) -> str:
        return str(obs.task_language)

    def raw_state(self, obs: Observation) -> np.ndarray:
        """openpi's 8-D LIBERO state from the env's proprioception."""
        proprio = obs.proprio
        if proprio is None:
            raise ValueError(
                "π0.5 needs the robot state (Observation.proprio: robot0_eef_pos, "
                "robot0_eef_quat, robot0_gripper_qpos); the env worker did not send it"
            )
        return T.libero_state(
            proprio["robot0_eef_pos"], proprio["robot0_eef_quat"], proprio["robot0_gripper_qpos"]
        )

    def model_state(self, obs: Observation) -> np.ndarray:
        """The state SGLang expects: normalized, zero-padded to ``pad_state_to``, float32."""
        assert self.stats is not None
        state = T.normalize(
            self.raw_state(obs), self.stats.state, self.normalization, self.stats.convention
        )
        if self.pad_state_to is not None:
            state = T.pad_to_dim(state, self.pad_state_to)
        return state.astype(np.float32)

    def build_request(self, observations: list[Observation], request_id: str) -> dict[str, Any]:
        if len(observations) != 1:
            raise ValueError(
                f"π0.5 takes one observation per request (SGLang's Pi05Pipeline reports "
                f"capabilities.batch_inputs false), got {len(observations)}"
            )
        obs = observations[0]
        if self.api == "openpi_websocket":
            return self._openpi_request(obs)
        images = T.libero_images(obs.agentview, obs.wrist, self.image_size)
        state: Any = self.model_state(obs)
        if self.wire_format == "json":
            images = {key: _png_base64(image) for key, image in images.items()}
            state = state.tolist()
        observation = {"images": images, "image_masks": T.image_masks(), "state": state}
        if self.api == "sglang_websocket":
            payload = {
                "request_id": request_id,
                "prompt": self.prompt_key(obs),
                **observation,
                "action_horizon": self.action_horizon,
                "action_dim": self.model_action_dim,
                "num_inference_steps": self.num_inference_steps,
                "output_format": "numpy",
            }
            if obs.privileged_state is not None:
                payload["privileged_state"] = obs.privileged_state
            return payload
        input_block: dict[str, Any] = {"prompt": self.prompt_key(obs), "observation": observation}
        if obs.privileged_state is not None:
            input_block["privileged_state"] = obs.privileged_state
        return {
            "request_id": request_id,
            "input": input_block,
            "parameters": {
                "action_horizon": self.action_horizon,
                "action_dim": self.model_action_dim,
                "num_inference_steps": self.num_inference_steps,
            },
            "runtime": {
                "response_format": self.response_format,
                "output_format": "numpy" if self.wire_format == "msgpack" else "list",
            },
        }

    def _openpi_request(self, obs: Observation) -> dict[str, Any]:
        """``examples/libero/main.py``'s element, byte for byte."""
        size = self.image_size
        payload: dict[str, Any] = {
            "observation/image": T.resize_with_pad(T.rotate_180(obs.agentview), size, size),
            "observation/wrist_image": T.resize_with_pad(T.rotate_180(obs.wrist), size, size),
            "observation/state": self.raw_state(obs),
            "prompt": str(obs.task_language),
        }
        if obs.privileged_state is not None:
            payload["privileged_state"] = obs.privileged_state
        return payload

    # ---------------------------------------------------------------- responses

    def _chunk(self, response: Any) -> np.ndarray:
        if not isinstance(response, dict):
            raise PolicyResponseError(
                f"π0.5 response must be an object, got {type(response).__name__}"
            )
        if "data" in response:
            data = response["data"]
            if not isinstance(data, list) or len(data) != 1:
                raise PolicyResponseError(
                    f"π0.5 response 'data' must hold exactly one entry (one observation per "
                    f"request), got {str(data)[:200]}"
                )
            action = data[0].get("action") if isinstance(data[0], dict) else None
            if not isinstance(action, dict) or "values" not in action:
                raise PolicyResponseError("π0.5 response data[0] has no 'action.values'")
            values, where = action["values"], "data[0].action.values"
        elif "actions" in response:
            values, where = response["actions"], "actions"
        else:
            raise PolicyResponseError(
                "π0.5 response has neither 'data' (SGLang envelope) nor 'actions'; got keys "
                f"{sorted(response)[:12]}. Check that the server is a π0.5 server and "
                "policy.pi05.api matches it"
            )
        try:
            chunk = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise PolicyResponseError(f"π0.5 response {where} is not numeric ({exc})") from exc
        if chunk.ndim == 3 and chunk.shape[0] == 1:
            chunk = chunk[0]
        if chunk.ndim != 2:
            raise PolicyResponseError(
                f"π0.5 response {where} must be [H, D] for one observation, got {chunk.shape}"
            )
        if chunk.shape[0] < self.replan_steps:
            raise PolicyResponseError(
                f"π0.5 response {where} has {chunk.shape[0]} action rows, fewer than "
                f"policy.pi05.replan_steps ({self.replan_steps})"
            )
        return chunk

    def parse_response(self, response: dict[str, Any], batch_size: int) -> np.ndarray:
        if batch_size != 1:
            raise ValueError(f"π0.5 answers one observation per request, got {batch_size}")
        chunk = self._chunk(response)
        if self.api == "openpi_websocket":
            if chunk.shape[1] != T.LIBERO_ACTION_DIM:
                raise PolicyResponseError(
                    f"the server answered actions of shape {list(chunk.shape)} where openpi's "
                    f"serve_policy.py answers [N, {T.LIBERO_ACTION_DIM}] LIBERO actions (its "
                    "transforms de-normalize and cut them). A model-space answer such as "
                    "[50, 32] comes from SGLang's /openpi/policy: set policy.pi05.api to "
                    "sglang_websocket"
                )
            actions = chunk
        else:
            if chunk.shape[1] < T.LIBERO_ACTION_DIM:
                raise PolicyResponseError(
                    f"π0.5 response actions have {chunk.shape[1]} channels, fewer than "
                    f"LIBERO's {T.LIBERO_ACTION_DIM}"
                )
            assert self.stats is not None
            actions = T.unnormalize(
                chunk[:, : T.LIBERO_ACTION_DIM],
                self.stats.actions,
                self.normalization,
                self.stats.convention,
            )
        actions = actions[: self.replan_steps]
        if not np.all(np.isfinite(actions)):
            raise PolicyResponseError("π0.5 response actions contain NaN or infinity")
        return actions[None]

    # ---------------------------------------------------------------- provenance

    def settings_summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "family": self.family,
            "api": self.api,
            "replan_steps": self.replan_steps,
            "image_size": self.image_size,
        }
        if self.stats is not None:
            summary.update(
                {
                    "norm_stats_path": str(self.stats.source),
                    "norm_stats_sha256": self.stats_sha256,
                    "stats_convention": self.stats.convention,
                    "normalization": self.normalization,
                    "pad_state_to": self.pad_state_to,
                    "action_horizon": self.action_horizon,
                    "model_action_dim": self.model_action_dim,
                    "num_inference_steps": self.num_inference_steps,
                }
            )
        return summary

    def check_server_metadata(self, metadata: dict[str, Any]) -> None:
        served = metadata.get("policy_family") if isinstance(metadata, dict) else None
        if self.api == "openpi_websocket" and served == "pi05":
            raise PolicyResponseError(
                "the websocket server is SGLang's /openpi/policy (its metadata reports "
                "policy_family 'pi05' and it answers model-space actions), but "
                "policy.pi05.api is openpi_websocket: set it to sglang_websocket"
            )
        super().check_server_metadata(metadata)
