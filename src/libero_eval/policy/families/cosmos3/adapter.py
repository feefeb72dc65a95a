"""Cosmos3 (SGLang action API, LIBERO domain) adapter.

Request: SGLang's envelope ``{"request_id", "input", "parameters", "runtime"}`` with every
Cosmos3 parameter explicit, because the server's defaults (fps 5, 832x480, 35 steps, seed 42)
differ from the LIBERO training recipe. Parameter choices, checked against SGLang 0.5.23
``entrypoints/action/cosmos3.py``:

- ``num_frames`` and ``action_horizon = num_frames - 1`` are both sent; the server requires
  ``num_frames == action_horizon + 1`` and ``(num_frames - 1) % 4 == 0``.
- ``domain_name`` and ``raw_action_dim`` are sent (LIBERO has no default action width).
- ``action_normalization`` is NOT sent, like RLinf's Cosmos3 client: the server only uses it
  when its own pipeline config sets ``action_stats_path`` (default None), in which case it
  would de-normalize server-side and this adapter's de-normalization would be applied twice.
  Serve Cosmos3 without a server-side stats path; the client owns de-normalization.
- ``guidance_scale`` is sent only when configured (the server default is 1.0).

Response: the per-input envelope (``data[i].action.values``, ``[H, D]``, ordered by
``input_index``) or the raw form (``actions``, ``[B, H, D]``); D may be padded beyond
``raw_action_dim``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

import libero_eval.policy.families.cosmos3.actions as action_math
from libero_eval import package_data, settings_schema
from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.errors import PolicyResponseError
from libero_eval.policy.families.cosmos3.settings import CHOICES, PATH
from libero_eval.policy.families.cosmos3.settings import FIELDS as POLICY_FIELDS

# Every `policy.cosmos3.*` field (its schema.yaml lists them, once) but guidance_scale is required.
REQUIRED_SETTINGS = tuple(key for key in POLICY_FIELDS if key != "guidance_scale")
__all__ = ["CHOICES", "POLICY_FIELDS", "Cosmos3Adapter"]  # the schema's, as the tests compare


def _parse_size(value: Any) -> tuple[int, int]:
    """``"WxH"`` -> (width, height)."""
    try:
        width_text, height_text = str(value).lower().split("x")
        width, height = int(width_text), int(height_text)
    except ValueError:
        raise ValueError(
            f"policy.cosmos3.size must be 'WIDTHxHEIGHT' such as '320x192', got {value!r}"
        ) from None
    if width < 1 or height < 1:
        raise ValueError(f"policy.cosmos3.size must be positive, got {value!r}")
    return width, height


def _png_base64(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class Cosmos3Adapter(PolicyAdapter):
    """Cosmos3 policy mode on LIBERO: two cameras -> one concatenated image + prompt; normalized
    ``[dxyz, rot6d, gripper]`` chunks -> LIBERO 7-D actions."""

    family: ClassVar[str] = "cosmos3"

    @classmethod
    def check_run_config(cls, config: dict[str, Any]) -> None:
        """What the adapter cannot check itself: the statistics file exists, and the server's
        files (the reference server's statistics, SGLang's converted model directory)."""
        cosmos3, server = config["policy"]["cosmos3"], config["server"]
        chunks, frames = cosmos3["num_action_chunks"], cosmos3["num_frames"]
        if frames != chunks + 1:
            raise ValueError(
                f"policy.cosmos3.num_frames ({frames}) must equal "
                f"policy.cosmos3.num_action_chunks + 1 ({chunks + 1}); Cosmos3 predicts "
                "num_frames - 1 actions"
            )
        stats_path = package_data.resolve(cosmos3["action_stats_path"])
        if not stats_path.is_file():
            raise ValueError(
                f"policy.cosmos3.action_stats_path: {stats_path} does not exist (relative paths "
                f"start at {Path.cwd()}); point it at a Cosmos3 action-stats JSON such as "
                "libero_eval:stats/libero_native_frame_wise_relative_rot6d.json"
            )
        if server["backend"] == "reference":
            reference_stats = package_data.resolve(server["reference"]["action_stats_path"])
            if not reference_stats.is_file():
                raise ValueError(
                    f"server.reference.action_stats_path: {reference_stats} does not exist; "
                    "point it at the model's action-stats JSON, e.g. "
                    "libero_eval:stats/libero_native_frame_wise_relative_rot6d.json"
                )
        if server["backend"] == "sglang":
            model_path = server["sglang"]["model_path"]
            if not model_path:
                raise ValueError(
                    "server.sglang.model_path is not set: point it at the converted Cosmos3 "
                    "model_diffusers/ directory"
                )
            if not (Path(model_path) / "model_index.json").is_file():
                raise ValueError(
                    f"server.sglang.model_path: {model_path} has no model_index.json; it must "
                    "be the converted Cosmos3 diffusers directory (model_index.json, "
                    "text_tokenizer/, ...)"
                )

    def __init__(self, settings: dict[str, Any]):
        """``settings``: ``policy.cosmos3`` (or a ``policy`` mapping that holds it)."""
        if not isinstance(settings, dict):
            raise ValueError(f"policy settings must be a mapping, got {type(settings).__name__}")
        settings = settings.get("cosmos3", settings)
        if not isinstance(settings, dict):
            raise ValueError(f"policy.cosmos3 must be a mapping, got {type(settings).__name__}")
        missing = [key for key in REQUIRED_SETTINGS if key not in settings]
        if missing:
            raise ValueError(
                "Cosmos3 policy settings are missing "
                + ", ".join(f"policy.cosmos3.{key}" for key in missing)
                + "; set them in the config (see the LIBERO reference settings)"
            )
        self._policy = dict(settings)
        as_config = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
        errors = settings_schema.shared_errors(as_config, *PATH)
        if errors:
            raise ValueError("; ".join(errors))
        for key in ("action_fps", "guidance_scale"):  # a schema cannot refuse NaN or infinity
            if settings.get(key) is not None and not math.isfinite(settings[key]):
                raise ValueError(
                    f"policy.cosmos3.{key} must be a finite number, got {settings[key]}"
                )
        self.action_mode: str = settings["action_mode"]
        self.raw_action_dim: int = settings["raw_action_dim"]
        if self.raw_action_dim != action_math.MODEL_ACTION_DIM:
            raise ValueError(
                f"policy.cosmos3.raw_action_dim must be {action_math.MODEL_ACTION_DIM} "
                f"([dxyz, rot6d, gripper]), got {self.raw_action_dim}"
            )
        self.action_dim: int = settings["action_dim"]
        if self.action_dim != action_math.LIBERO_ACTION_DIM:
            raise ValueError(
                f"policy.cosmos3.action_dim must be {action_math.LIBERO_ACTION_DIM} (LIBERO's "
                f"action), got {self.action_dim}"
            )
        self.num_action_chunks: int = settings["num_action_chunks"]
        self.num_frames: int = settings["num_frames"]
        if (self.num_frames - 1) % 4 != 0:
            raise ValueError(
                "policy.cosmos3.num_frames must be 4k + 1 (Cosmos3 requires (num_frames - 1) % 4 "
                f"== 0), got {self.num_frames}; LIBERO uses 17"
            )
        self.fps: int = settings["fps"]
        self.action_fps = float(settings["action_fps"])
        self.action_view_point: str = settings["action_view_point"]
        self.num_inference_steps: int = settings["num_inference_steps"]
        self.width, self.height = _parse_size(settings["size"])
        self.seed: int = settings["seed"]
        self.domain_name: str = settings["domain_name"]
        scale = settings.get("guidance_scale")
        self.guidance_scale = None if scale is None else float(scale)
        self.normalization: str = settings["normalization"]
        self.gripper_mapping: str = settings["gripper_mapping"]
        self.orthonormalization: str = settings["orthonormalization"]
        # policy.cosmos3.transport png_base64: a JSON body with PNG images; msgpack: numpy arrays
        self.json_body = settings["transport"] == "png_base64"
        self.response_format: str = settings["response_format"]
        self.stats = action_math.load_action_stats(
            settings["action_stats_path"],
            action_math.stats_block_for(self.normalization),
            self.raw_action_dim,
        )
        self.stats_sha256 = hashlib.sha256(self.stats.source.read_bytes()).hexdigest()

    def statistics(self) -> dict[str, str | None]:
        return {"path": str(self.stats.source), "sha256": self.stats_sha256}

    def outcome_settings(self) -> dict[str, Any]:
        # The Cosmos3 fingerprint as before π0.5 existed (when these settings sat directly
        # under `policy`, beside `family`), so earlier results stay valid.
        settings = {
            k: v
            for k, v in self._policy.items()
            if not k.startswith("http_")
            and k not in ("transport", "response_format", "pi05", "family")
        }
        return {"family": self.family, **settings, "action_stats_path": self.stats_sha256}

    # ---------------------------------------------------------------- requests

    def prompt_key(self, obs: Observation) -> str:
        """The prompt; with the episode's sampling-seed offset (plan.seeds) when it has one, as
        a request carries one sampling seed: episodes of different seeds never share one."""
        prompt = action_math.augment_prompt(obs.task_language)
        offset = obs.sampling_seed_offset
        return prompt if not offset else f"{prompt}\x00seed{offset:+d}"

    def parameters(self, seed_offset: int = 0) -> dict[str, Any]:
        """The ``parameters`` block sent with every request; its ``seed`` is
        ``policy.cosmos3.seed`` plus the episodes' run-seed offset (0 with one seed)."""
        parameters: dict[str, Any] = {
            "action_mode": self.action_mode,
            "num_frames": self.num_frames,
            "action_horizon": self.num_frames - 1,
            "domain_name": self.domain_name,
            "raw_action_dim": self.raw_action_dim,
            "action_fps": self.action_fps,
            "fps": self.fps,
            "action_view_point": self.action_view_point,
            "num_inference_steps": self.num_inference_steps,
            "height": self.height,
            "width": self.width,
            "seed": self.seed + seed_offset,
        }
        if self.guidance_scale is not None:
            parameters["guidance_scale"] = self.guidance_scale
        return parameters

    def build_request(self, observations: list[Observation], request_id: str) -> dict[str, Any]:
        if not observations:
            raise ValueError("Cosmos3 request needs at least one observation")
        prompts = [action_math.augment_prompt(obs.task_language) for obs in observations]
        offsets = {obs.sampling_seed_offset for obs in observations}
        if len(offsets) > 1:
            raise ValueError(
                "a Cosmos3 request carries one sampling seed: its observations come from "
                f"episodes of different run seeds (offsets {sorted(offsets)})"
            )
        images = [
            action_math.preprocess_observation_image(
                obs.agentview, obs.wrist, width=self.width, height=self.height
            )
            for obs in observations
        ]
        references: list[Any] = (
            [{"b64_json": _png_base64(image)} for image in images] if self.json_body else images
        )
        input_block: dict[str, Any] = {
            "prompt": prompts[0] if len(set(prompts)) == 1 else prompts,
            "input_reference": references,
        }
        states = [obs.privileged_state for obs in observations]
        if any(state is not None for state in states):
            if any(state is None for state in states):
                raise ValueError(
                    "privileged_state must be set on all observations of a batch or on none "
                    "(rollout.send_privileged_state)"
                )
            input_block["privileged_state"] = states
        return {
            "request_id": request_id,
            "input": input_block,
            "parameters": self.parameters(offsets.pop()),
            "runtime": {
                "response_format": self.response_format,
                "output_format": "list" if self.json_body else "numpy",
            },
        }

    # ---------------------------------------------------------------- responses

    def _model_chunks(self, response: dict[str, Any], batch_size: int) -> list[np.ndarray]:
        if not isinstance(response, dict):
            raise PolicyResponseError(
                f"Cosmos3 response must be an object, got {type(response).__name__}"
            )
        if "data" in response:
            return self._envelope_chunks(response["data"], batch_size)
        if "actions" in response:
            actions = self._as_float_array(response["actions"], "actions")
            if actions.ndim == 2 and batch_size == 1:
                actions = actions[None]
            if actions.ndim != 3 or actions.shape[0] != batch_size:
                raise PolicyResponseError(
                    f"Cosmos3 raw response 'actions' must have shape [B={batch_size}, H, D], "
                    f"got {actions.shape}"
                )
            return list(actions)
        raise PolicyResponseError(
            "Cosmos3 response has neither 'data' (envelope) nor 'actions' (raw); got keys "
            f"{sorted(response)}. Check policy.cosmos3.response_format matches the server"
        )

    def _envelope_chunks(self, data: Any, batch_size: int) -> list[np.ndarray]:
        if not isinstance(data, list) or not data:
            raise PolicyResponseError(
                f"Cosmos3 response 'data' must be a non-empty list, got {str(data)[:200]}"
            )
        entries = []
        for position, item in enumerate(data):
            action = item.get("action") if isinstance(item, dict) else None
            if not isinstance(action, dict) or "values" not in action:
                raise PolicyResponseError(
                    f"Cosmos3 response data[{position}] has no 'action.values'; check "
                    "policy.cosmos3.action_mode is 'policy' and the model has an action head"
                )
            echoed_dim = action.get("raw_action_dim")
            if echoed_dim is not None and echoed_dim != self.raw_action_dim:
                raise PolicyResponseError(
                    f"Cosmos3 response data[{position}].action.raw_action_dim is {echoed_dim}, "
                    f"policy.cosmos3.raw_action_dim is {self.raw_action_dim}"
                )
            index = item.get("input_index", item.get("index", position))
            values = self._as_float_array(action["values"], f"data[{position}].action.values")
            entries.append((index, position, values))
        # Older servers put the whole batch in one entry: data[0].action.values [B, H, D].
        if len(entries) == 1 and entries[0][2].ndim == 3:
            values = entries[0][2]
            if values.shape[0] != batch_size:
                raise PolicyResponseError(
                    f"Cosmos3 response data[0].action.values holds {values.shape[0]} chunks, "
                    f"expected {batch_size} (one per observation)"
                )
            return list(values)
        if len(entries) != batch_size:
            raise PolicyResponseError(
                f"Cosmos3 response has {len(entries)} action entries, expected {batch_size} "
                "(one per observation in the request)"
            )
        indexes = sorted(index for index, _, _ in entries)
        if indexes != list(range(batch_size)):
            raise PolicyResponseError(
                f"Cosmos3 response input_index values {indexes} are not 0..{batch_size - 1}"
            )
        chunks = []
        for _index, position, values in sorted(entries, key=lambda entry: entry[0]):
            if values.ndim != 2:
                raise PolicyResponseError(
                    f"Cosmos3 response data[{position}].action.values must be [H, D], "
                    f"got shape {values.shape}"
                )
            chunks.append(values)
        return chunks

    @staticmethod
    def _as_float_array(values: Any, where: str) -> np.ndarray:
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise PolicyResponseError(
                f"Cosmos3 response {where} is not a numeric array ({exc})"
            ) from exc
        if array.size == 0:
            raise PolicyResponseError(f"Cosmos3 response {where} is empty, shape {array.shape}")
        return array

    def parse_response(self, response: dict[str, Any], batch_size: int) -> np.ndarray:
        chunks = self._model_chunks(response, batch_size)
        result = np.empty((batch_size, self.num_action_chunks, self.action_dim), dtype=np.float64)
        for index, chunk in enumerate(chunks):
            try:
                result[index] = action_math.model_chunk_to_libero(
                    chunk,
                    self.stats,
                    raw_action_dim=self.raw_action_dim,
                    num_action_chunks=self.num_action_chunks,
                    orthonormalization=self.orthonormalization,
                    gripper_mapping=self.gripper_mapping,
                )
            except ValueError as exc:
                raise PolicyResponseError(
                    f"Cosmos3 response action for input {index} is invalid: {exc}"
                ) from exc
        return result
