"""π0.5 adapter: openpi's LIBERO transforms on the client, three ways to reach a server.

``policy.pi05.api`` picks the server and where the transforms run, and with it the adapter
class (``Pi05Adapter(settings)`` builds it; :data:`API_ADAPTERS`):

- ``sglang_http`` (:class:`Pi05SglangHttpAdapter`): SGLang 0.5.23
  ``POST /v1/actions/generations`` (``Pi05Pipeline``). The body is SGLang's envelope
  ``{"request_id", "input": {"prompt", "observation": {"images", "image_masks", "state"}},
  "parameters": {"action_horizon", "action_dim", "num_inference_steps"}, "runtime"}``
  (``entrypoints/action/protocol.py`` ``_action_request_to_observation`` /
  ``_build_action_model_sampling_params``).
- ``sglang_websocket`` (:class:`Pi05SglangWebsocketAdapter`): SGLang's ``/openpi/policy``
  websocket (``entrypoints/action/openpi.py``): the same observation as one flat msgpack map,
  ``actions`` back as a numpy array.
- ``openpi_websocket`` (:class:`Pi05OpenpiServerAdapter`): openpi's own
  ``scripts/serve_policy.py``: the raw observation (``observation/image``,
  ``observation/wrist_image``, ``observation/state`` (8), ``prompt``) as
  ``examples/libero/main.py`` sends it; the server normalizes and answers ``actions`` [N, 7].

With SGLang (:class:`Pi05SglangAdapter`, the base of both SGLang classes) the client does what
the checkpoint's own training pipeline did before the model (SGLang normalizes nothing), and
the checkpoint decides how (``checkpoint.py`` beside it reads its ``config.json`` as SGLang
does, ``model_setup.py`` takes from it the state width, statistics and tokenizer, each
configured value of ``policy.pi05`` (``settings.py``) checked against it; ``docs/pi05.md``
cites every value):

- **LeRobot lineage**: the checkpoint's camera names (``image`` = agentview, ``image2`` =
  wrist; ``camera_order`` with LeRobot's image blocks where SGLang would count an empty
  camera twice), each frame rotated 180 degrees (LeRobot's ``LiberoProcessorStep``) and sent as
  float32 in [0, 1] at its rendered size, so SGLang's resize is LeRobot's bilinear resize of
  float images exactly; the 8-D state normalized by the checkpoint's normalizer, unpadded;
  SGLang builds the prompt ``"Task: ..., State: ...;\nAction: "`` as LeRobot >= 0.5 does.
- **openpi lineage**: openpi's slots (``base_0_rgb``, ``left_wrist_0_rgb``, right wrist zeros
  with mask False), images resized with padding to 224 on the client
  (``examples/libero/main.py``), the state normalized and padded to 32
  (``PadStatesAndActions``), and openpi's prompt sent pre-tokenized as ``tokens`` /
  ``token_masks`` (``paligemma.py`` beside it): no state for ``discrete_state_input: false``.
- **no checkpoint** (the CPU reference server): SGLang's defaults, openpi's slots, the state
  padded to ``pad_state_to`` and discretized by the server.

The ``[H, D]`` model-space answer is de-normalized, cut to the first 7 channels and to
``replan_steps`` rows. SGLang takes one observation per request (metadata
``capabilities.batch_inputs: false``); throughput comes from requests in flight.
"""

from __future__ import annotations

import base64
import hashlib
import io
from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

import libero_eval.policy.families.pi05.model_setup as model_setup
import libero_eval.policy.families.pi05.openpi_transforms as T
import libero_eval.policy.families.pi05.paligemma as paligemma
from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.errors import PolicyResponseError
from libero_eval.policy.families.pi05.checkpoint import Pi05Layout, read_checkpoint
from libero_eval.policy.families.pi05.run_config import check_pi05_run_config
from libero_eval.policy.families.pi05.settings import CHOICES, DEFAULTS, agree, checked

OPENPI_SERVER_HORIZON = 10  # openpi pi05_libero answers [10, 7] (action_horizon=10)
__all__ = ["API_ADAPTERS", "CHOICES", "DEFAULTS", "Pi05Adapter"]


def _png_base64(image: np.ndarray) -> dict[str, str]:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return {"b64_json": base64.b64encode(buffer.getvalue()).decode("ascii")}


class Pi05Adapter(PolicyAdapter):
    """π0.5 on LIBERO: what every ``policy.pi05.api`` shares (settings, the robot state, the
    answer's action chunk, the fingerprint).

    ``Pi05Adapter(settings)`` builds the class of ``policy.pi05.api``: :data:`API_ADAPTERS`.
    """

    family: ClassVar[str] = "pi05"
    check_run_config = staticmethod(check_pi05_run_config)

    def __new__(cls, settings: dict[str, Any]) -> Pi05Adapter:
        if cls is Pi05Adapter:
            cls = API_ADAPTERS[checked(settings)["api"]]
        return super().__new__(cls)

    def __init__(self, settings: dict[str, Any]):
        s = checked(settings)
        self._pi05 = dict(settings.get("pi05", settings))  # as configured (the fingerprint's)
        self.api: str = s["api"]
        self.num_inference_steps: int = s["num_inference_steps"]
        self.replan_steps: int = s["replan_steps"]
        self.image_size: int = s["image_size"]
        self.response_format: str = s["response_format"]
        self.normalization: str = s["normalization"]
        self.layout = Pi05Layout.sglang_default()
        self.stats: T.NormStats | None = None
        self.stats_sha256: str | None = None
        self.checkpoint_sha256: str | None = None
        self.tokenizer_model: Path | None = None  # openpi: SentencePiece model
        self.tokenizer_json: Path | None = None  # LeRobot <= 0.4.4: Hugging Face tokenizer
        self.discrete_state_input: bool | None = None
        self.action_horizon: int
        self.model_action_dim: int
        self.pad_state_to: int | None

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
        pi05["norm_stats_path"] = self.stats_sha256
        if self.checkpoint_sha256 is not None:
            pi05["checkpoint"] = self.checkpoint_sha256  # its config.json, not its path
        tokenizer = self.tokenizer_model or self.tokenizer_json
        if tokenizer is not None:  # the client's prompt tokens depend on its content
            pi05["tokenizer_path"] = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
        return {"family": "pi05", "pi05": pi05}

    # ---------------------------------------------------------------- requests

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

    def build_request(self, observations: list[Observation], request_id: str) -> dict[str, Any]:
        if len(observations) != 1:
            raise ValueError(
                f"π0.5 takes one observation per request (SGLang's Pi05Pipeline reports "
                f"capabilities.batch_inputs false), got {len(observations)}"
            )
        return self.request(observations[0], request_id)

    @abstractmethod
    def request(self, obs: Observation, request_id: str) -> dict[str, Any]:
        """The request body for one observation."""

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
        actions = self.libero_actions(self._chunk(response))[: self.replan_steps]
        if not np.all(np.isfinite(actions)):
            raise PolicyResponseError("π0.5 response actions contain NaN or infinity")
        return actions[None]

    @abstractmethod
    def libero_actions(self, chunk: np.ndarray) -> np.ndarray:
        """LIBERO actions ``[H, 7]`` from the answer's ``[H, D]`` chunk."""


class Pi05SglangAdapter(Pi05Adapter):
    """SGLang's ``Pi05Pipeline`` (which normalizes nothing): the client applies the
    checkpoint's own training transforms, by its lineage (``checkpoint.py`` beside it)."""

    def __init__(self, settings: dict[str, Any]):
        super().__init__(settings)
        s = checked(settings)
        # wire_format json (sglang_http only): images as PNG / lists; else numpy arrays
        self.json_body = False
        if s["checkpoint"] is not None:
            self.layout = read_checkpoint(s["checkpoint"], s["camera_views"])
            config_json = Path(s["checkpoint"]) / "config.json"
            self.checkpoint_sha256 = hashlib.sha256(config_json.read_bytes()).hexdigest()
        layout = self.layout
        self.action_horizon = agree(
            "action_horizon", s["action_horizon"], layout.action_horizon, layout
        )
        self.model_action_dim = agree(
            "model_action_dim", s["model_action_dim"], layout.action_dim, layout
        )
        self.pad_state_to = model_setup.state_width(layout, s["pad_state_to"])
        if self.replan_steps > self.action_horizon:
            raise ValueError(
                f"policy.pi05.replan_steps ({self.replan_steps}) cannot exceed the action "
                f"horizon ({self.action_horizon}; {layout.describe()})"
            )
        self.stats, self.stats_sha256 = model_setup.load_stats(
            layout, s["norm_stats_path"], self.normalization
        )
        tokenizer = model_setup.find_tokenizer(layout, s)
        self.tokenizer_model, self.tokenizer_json = tokenizer.model, tokenizer.json
        self.discrete_state_input = tokenizer.discrete_state_input

    # ---------------------------------------------------------------- requests

    def normalized_state(self, obs: Observation) -> np.ndarray:
        """The 8-D state in model space (the checkpoint's statistics and formulas)."""
        assert self.stats is not None
        return T.normalize(
            self.raw_state(obs), self.stats.state, self.normalization, self.stats.convention
        )

    def model_state(self, obs: Observation) -> np.ndarray:
        """The state SGLang receives: normalized, zero-padded to the checkpoint's width."""
        state = self.normalized_state(obs)
        if self.pad_state_to is not None:
            state = T.pad_to_dim(state, self.pad_state_to)
        return state.astype(np.float32)

    def model_images(self, obs: Observation) -> tuple[dict[str, Any], dict[str, bool]]:
        """The images and masks keyed by the checkpoint's camera names."""
        layout = self.layout
        if layout.lineage != "lerobot":  # openpi's slots, resized with padding on the client
            return T.libero_images(obs.agentview, obs.wrist, self.image_size), T.image_masks()
        frames = {"agentview": obs.agentview, "wrist": obs.wrist}
        images: dict[str, Any] = {}
        masks: dict[str, bool] = {}
        for key, view in layout.camera_views.items():
            masks[key] = view is not None
            if view is not None:  # LeRobot: uint8 / 255 as float32, rotated 180 degrees
                images[key] = T.rotate_180(frames[view]).astype(np.float32) / np.float32(255)
        return images, masks

    def prompt_tokens(self, obs: Observation) -> tuple[np.ndarray, np.ndarray] | None:
        """The tokenized prompt where the checkpoint's training pipeline differs from SGLang's
        prompt (openpi; LeRobot <= 0.4.4); None where SGLang builds the prompt."""
        if self.tokenizer_json is not None:
            return paligemma.lerobot_padded_tokens(
                self.tokenizer_json,
                str(obs.task_language),
                self.normalized_state(obs),
                self.layout.max_state_dim,
                self.layout.max_token_len,
            )
        if self.tokenizer_model is None:
            return None
        state = self.normalized_state(obs) if self.discrete_state_input else None
        return paligemma.openpi_tokens(
            self.tokenizer_model, str(obs.task_language), state, self.layout.max_token_len
        )

    def model_observation(self, obs: Observation) -> dict[str, Any]:
        """SGLang's observation: ``images``, ``image_masks``, ``state`` (and ``tokens``,
        ``token_masks`` where the client builds the prompt; ``camera_order`` where the
        checkpoint's LeRobot image blocks differ from SGLang's keys, ``Pi05Layout``)."""
        images, masks = self.model_images(obs)
        state: Any = self.model_state(obs)
        if self.json_body:  # PNG for 8-bit images; float images as exact lists
            images = {
                key: image.tolist() if image.dtype.kind == "f" else _png_base64(image)
                for key, image in images.items()
            }
            state = state.tolist()
        observation: dict[str, Any] = {"images": images, "image_masks": masks, "state": state}
        if self.layout.camera_order is not None:  # LeRobot's image blocks, not SGLang's keys
            observation["camera_order"] = list(self.layout.camera_order)
        tokens = self.prompt_tokens(obs)
        if tokens is not None:
            as_wire = (lambda a: a.tolist()) if self.json_body else (lambda a: a)
            observation["tokens"], observation["token_masks"] = map(as_wire, tokens)
        return observation

    # ---------------------------------------------------------------- responses

    def libero_actions(self, chunk: np.ndarray) -> np.ndarray:
        """The model-space chunk de-normalized and cut to LIBERO's 7 channels."""
        if chunk.shape[1] < T.LIBERO_ACTION_DIM:
            raise PolicyResponseError(
                f"π0.5 response actions have {chunk.shape[1]} channels, fewer than "
                f"LIBERO's {T.LIBERO_ACTION_DIM}"
            )
        assert self.stats is not None
        return T.unnormalize(
            chunk[:, : T.LIBERO_ACTION_DIM],
            self.stats.actions,
            self.normalization,
            self.stats.convention,
        )


class Pi05SglangHttpAdapter(Pi05SglangAdapter):
    """``sglang_http``: SGLang's envelope for ``POST /v1/actions/generations``."""

    def __init__(self, settings: dict[str, Any]):
        super().__init__(settings)
        self.json_body = checked(settings)["wire_format"] == "json"

    def request(self, obs: Observation, request_id: str) -> dict[str, Any]:
        input_block: dict[str, Any] = {
            "prompt": self.prompt_key(obs),
            "observation": self.model_observation(obs),
        }
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
                "output_format": "list" if self.json_body else "numpy",
            },
        }


class Pi05SglangWebsocketAdapter(Pi05SglangAdapter):
    """``sglang_websocket``: the same observation as one flat map (SGLang's ``/openpi/policy``)."""

    def request(self, obs: Observation, request_id: str) -> dict[str, Any]:
        payload = {
            "request_id": request_id,
            "prompt": self.prompt_key(obs),
            **self.model_observation(obs),
            "action_horizon": self.action_horizon,
            "action_dim": self.model_action_dim,
            "num_inference_steps": self.num_inference_steps,
            "output_format": "numpy",
        }
        if obs.privileged_state is not None:
            payload["privileged_state"] = obs.privileged_state
        return payload


class Pi05OpenpiServerAdapter(Pi05Adapter):
    """``openpi_websocket``: openpi's own ``serve_policy.py``, which holds the checkpoint's
    transforms and statistics; the client sends the raw observation."""

    def __init__(self, settings: dict[str, Any]):
        super().__init__(settings)
        s = checked(settings)
        self.action_horizon = s["action_horizon"] or OPENPI_SERVER_HORIZON
        self.model_action_dim = T.LIBERO_ACTION_DIM
        self.pad_state_to = None

    def request(self, obs: Observation, request_id: str) -> dict[str, Any]:
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

    def libero_actions(self, chunk: np.ndarray) -> np.ndarray:
        if chunk.shape[1] != T.LIBERO_ACTION_DIM:
            raise PolicyResponseError(
                f"the server answered actions of shape {list(chunk.shape)} where openpi's "
                f"serve_policy.py answers [N, {T.LIBERO_ACTION_DIM}] LIBERO actions (its "
                "transforms de-normalize and cut them). A model-space answer such as "
                "[50, 32] comes from SGLang's /openpi/policy: set policy.pi05.api to "
                "sglang_websocket"
            )
        return chunk

    def check_server_metadata(self, metadata: dict[str, Any]) -> None:
        served = metadata.get("policy_family") if isinstance(metadata, dict) else None
        if served == "pi05":
            raise PolicyResponseError(
                "the websocket server is SGLang's /openpi/policy (its metadata reports "
                "policy_family 'pi05' and it answers model-space actions), but "
                "policy.pi05.api is openpi_websocket: set it to sglang_websocket"
            )
        super().check_server_metadata(metadata)


#: ``policy.pi05.api`` -> its adapter class
API_ADAPTERS: dict[str, type[Pi05Adapter]] = {
    "sglang_http": Pi05SglangHttpAdapter,
    "sglang_websocket": Pi05SglangWebsocketAdapter,
    "openpi_websocket": Pi05OpenpiServerAdapter,
}
