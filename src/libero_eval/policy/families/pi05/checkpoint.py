"""A π0.5 checkpoint's own layout: cameras, state width, chunk size, statistics, lineage.

SGLang 0.5.23 rewrites its π0.5 config from the checkpoint's ``config.json`` when it loads the
model (``runtime/models/vlas/pi05_policy.py``, ``Pi05PolicyModel._apply_checkpoint_config``,
lines 520-575), before the preprocessor is built; the preprocessor then takes its camera keys
and the widest state it accepts from that config (``pi05_preprocess.py``
``Pi05Preprocessor.__call__``). A camera it does not find becomes a blank image with mask
False, and ``/v1/actions/metadata`` keeps showing the defaults. So the client must read the
same file the same way: :func:`read_checkpoint` does, and names what it derived.

Two lineages are laid out differently:

- **LeRobot** (``lerobot/pi05_*``; LeRobot's ``PI05Config`` saved as ``config.json``, with
  ``"type": "pi05"``, ``input_features`` and ``policy_preprocessor.json``). Cameras are the
  ``VISUAL`` features' last name part (``observation.images.image`` -> ``image``), the state
  width is the ``STATE`` feature's shape (8 for LIBERO), the chunk is ``chunk_size``; the
  statistics and their modes are the normalizer step's (``policy_preprocessor.json``).
  SGLang adds ``empty_camera_i`` for ``empty_cameras`` even when ``input_features`` already
  lists it (LeRobot's ``validate_features`` writes it there, and a trained checkpoint keeps
  both), so its keys can name a camera twice where LeRobot feeds each image feature once,
  present cameras first: :attr:`Pi05Layout.camera_order` is LeRobot's list then, and the client
  sends it as SGLang's ``camera_order``.
- **openpi** (openpi's ``examples/convert_jax_model_to_pytorch.py``, lines 544-552: a
  ``config.json`` of ``action_dim``, ``action_horizon``, ``paligemma_variant``,
  ``action_expert_variant``, ``precision``; the statistics under ``assets/<asset_id>/``).
  SGLang reads ``chunk_size``, not ``action_horizon``, so such a directory must also carry
  ``"chunk_size"`` equal to its horizon, or SGLang runs horizon 50; that is refused here. The
  cameras are SGLang's defaults, which are openpi's slots (``base_0_rgb``,
  ``left_wrist_0_rgb``, ``right_wrist_0_rgb``), and the state width is 32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Lineage = Literal["lerobot", "openpi", "sglang_default"]
View = Literal["agentview", "wrist"]

# SGLang 0.5.23's Pi05PipelineConfig defaults (configs/pipeline_configs/pi05.py).
SGLANG_IMAGE_KEYS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
SGLANG_DEFAULTS = {
    "action_horizon": 50,
    "n_action_steps": 50,
    "action_dim": 32,
    "state_dim": 32,
    "output_action_dim": 32,
    "max_token_len": 200,
    "image_size": (224, 224),
}

# Which LIBERO camera feeds each checkpoint camera name.
# - LeRobot's LIBERO env names agentview_image "image" and robot0_eye_in_hand_image "image2"
#   (lerobot 0.6.1 envs/libero.py, camera_name_mapping default, lines 156-160); checkpoints
#   trained with another mapping use other names, e.g. "front"/"wrist".
# - openpi's LIBERO policy: base_0_rgb = image, left_wrist_0_rgb = wrist image,
#   right_wrist_0_rgb = zeros with mask False (src/openpi/policies/libero_policy.py, 57-67).
KNOWN_VIEWS: dict[str, View | None] = {
    "image": "agentview",
    "image2": "wrist",
    "front": "agentview",
    "agentview": "agentview",
    "wrist": "wrist",
    "wrist_image": "wrist",
    "base_0_rgb": "agentview",
    "left_wrist_0_rgb": "wrist",
    "right_wrist_0_rgb": None,
}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read, or that contradicts the config."""


@dataclass(frozen=True)
class Pi05Layout:
    """What the server will expect, as SGLang derives it from the checkpoint."""

    lineage: Lineage
    camera_keys: tuple[str, ...]  # SGLang's image_keys, in order
    camera_views: dict[str, View | None]  # key -> LIBERO view; None = blank, mask False
    # LeRobot's image blocks, in its order, where they differ from camera_keys (else None):
    # the request's camera_order
    state_dim: int  # the widest state the preprocessor accepts
    max_state_dim: int  # LeRobot's max_state_dim (its <= 0.4.4 prompt padding)
    action_horizon: int  # rows per answer (the model's noise shape)
    n_action_steps: int
    action_dim: int  # padded model action width
    output_action_dim: int
    max_token_len: int
    source: Path | None = None
    camera_order: tuple[str, ...] | None = None
    stats_path: Path | None = None  # the checkpoint's statistics (file or directory)
    derived: dict[str, str] = field(default_factory=dict)  # value -> where it was read

    @classmethod
    def sglang_default(cls) -> Pi05Layout:
        """No checkpoint: SGLang's own defaults (the reference server's stand-in model)."""
        return cls(
            lineage="sglang_default",
            camera_keys=SGLANG_IMAGE_KEYS,
            camera_views={key: KNOWN_VIEWS[key] for key in SGLANG_IMAGE_KEYS},
            state_dim=SGLANG_DEFAULTS["state_dim"],
            max_state_dim=SGLANG_DEFAULTS["state_dim"],
            action_horizon=SGLANG_DEFAULTS["action_horizon"],
            n_action_steps=SGLANG_DEFAULTS["n_action_steps"],
            action_dim=SGLANG_DEFAULTS["action_dim"],
            output_action_dim=SGLANG_DEFAULTS["output_action_dim"],
            max_token_len=SGLANG_DEFAULTS["max_token_len"],
        )

    def describe(self) -> str:
        views = ", ".join(f"{k}={v or 'blank'}" for k, v in self.camera_views.items())
        return (
            f"{self.lineage} checkpoint {self.source or '(none: SGLang defaults)'}: cameras "
            f"{views}; state width {self.state_dim}; action horizon {self.action_horizon}"
        )


def _int(payload: dict[str, Any], key: str, default: int, where: Path) -> int:
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _lerobot_cameras(
    payload: dict[str, Any], where: Path, overrides: dict[str, str | None]
) -> tuple[list[str], int | None]:
    """``_apply_checkpoint_config``'s reading of ``input_features`` (VISUAL keys' last part,
    in file order; the STATE feature's width)."""
    keys: list[str] = []
    state_dim = None
    features = payload.get("input_features") or {}
    if not isinstance(features, dict):
        raise CheckpointError(f"{where}: input_features must be a mapping")
    for name, feature in features.items():
        kind = feature.get("type") if isinstance(feature, dict) else None
        if kind == "VISUAL":
            keys.append(name.rsplit(".", 1)[-1])
        elif kind == "STATE" and feature.get("shape"):
            state_dim = int(feature["shape"][0])
    empty = payload.get("empty_cameras", 0) or 0
    keys.extend(f"empty_camera_{i}" for i in range(int(empty)))
    for key in keys:
        if key not in overrides and key not in KNOWN_VIEWS and not key.startswith("empty_camera"):
            raise CheckpointError(
                f"{where}: camera {key!r} (input_features) is not a LIBERO camera name this "
                f"project knows ({sorted(k for k, v in KNOWN_VIEWS.items() if v)}); say which "
                f"LIBERO view feeds it with policy.pi05.camera_views: {{{key}: agentview}} "
                "(or wrist)"
            )
    return keys, state_dim


def _lerobot_order(keys: list[str], views: dict[str, View | None]) -> tuple[str, ...] | None:
    """The image blocks LeRobot feeds, where SGLang's ``keys`` differ from them: each VISUAL
    feature once (``input_features`` is a dict and ``PI05Config.validate_features`` adds
    ``empty_camera_i`` by assignment), the cameras in the batch first and the missing ones
    (blank, mask False) after them (``PI05Policy._preprocess_images``)."""
    unique = list(dict.fromkeys(keys))
    fed = [k for k in unique if views[k] is not None] + [k for k in unique if views[k] is None]
    return None if fed == keys else tuple(fed)


def _openpi_stats(directory: Path) -> Path | None:
    found = sorted(directory.glob("assets/*/norm_stats.json")) + sorted(
        directory.glob("assets/*/*/norm_stats.json")
    )
    if len(found) > 1:
        raise CheckpointError(
            f"{directory}: several assets/<asset_id>/norm_stats.json ({[str(p) for p in found]}); "
            "name the one the checkpoint was trained with in policy.pi05.norm_stats_path"
        )
    return found[0].parent if found else None


def read_checkpoint(
    path: str | Path, camera_views: dict[str, str | None] | None = None
) -> Pi05Layout:
    """The layout SGLang will derive from the π0.5 checkpoint directory ``path``."""
    directory = Path(path)
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise CheckpointError(
            f"π0.5 checkpoint {path!s} (policy.pi05.checkpoint, or server.sglang.model_path "
            "when that is null) is not a local directory. If it is a Hugging Face id, "
            "download it first (e.g. `huggingface-cli download <id> --local-dir <dir>`) and "
            "give that directory: its config.json decides the cameras, state width and chunk "
            "size the server expects"
        )
    if not config_path.is_file():
        raise CheckpointError(
            f"π0.5 checkpoint {directory} has no config.json; SGLang would serve it with its "
            "defaults, which match no published checkpoint. Give the checkpoint's own directory"
        )
    try:
        payload = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_path} is not readable JSON ({exc})") from exc
    if not isinstance(payload, dict):
        raise CheckpointError(f"{config_path} must hold a JSON object")
    overrides = dict(camera_views or {})
    d = SGLANG_DEFAULTS
    derived: dict[str, str] = {}
    horizon = _int(payload, "chunk_size", d["action_horizon"], config_path)
    derived["action_horizon"] = "config.json chunk_size" if "chunk_size" in payload else "default"
    if "input_features" in payload or payload.get("type") == "pi05":
        lineage: Lineage = "lerobot"
        keys, feature_state = _lerobot_cameras(payload, config_path, overrides)
        state_dim = feature_state or _int(payload, "max_state_dim", d["state_dim"], config_path)
        derived["state_dim"] = "config.json input_features STATE shape"
        stats_path = directory if (directory / "policy_preprocessor.json").is_file() else None
    elif "action_horizon" in payload:
        lineage = "openpi"
        openpi_horizon = _int(payload, "action_horizon", horizon, config_path)
        if "chunk_size" not in payload or openpi_horizon != horizon:
            raise CheckpointError(
                f"{config_path}: openpi's action_horizon is {openpi_horizon} but SGLang reads "
                f"chunk_size ({payload.get('chunk_size', 'absent, so 50')}) and would sample "
                f'{horizon} actions. Add "chunk_size": {openpi_horizon} to config.json'
            )
        keys = list(SGLANG_IMAGE_KEYS)
        state_dim = _int(payload, "max_state_dim", d["state_dim"], config_path)
        derived["state_dim"] = "SGLang default (openpi pads the state to 32)"
        stats_path = _openpi_stats(directory)
    else:
        raise CheckpointError(
            f"{config_path} is neither a LeRobot π0.5 config (input_features, type pi05) nor "
            "an openpi conversion (action_horizon); this project does not know its layout"
        )
    views: dict[str, View | None] = {}
    for key in keys:
        view = overrides.get(key, KNOWN_VIEWS.get(key))
        if view not in ("agentview", "wrist", None):
            raise CheckpointError(
                f"policy.pi05.camera_views.{key} must be agentview, wrist or null, got {view!r}"
            )
        views[key] = view
    if "agentview" not in views.values():
        raise CheckpointError(
            f"{config_path}: no camera of {keys} is fed by LIBERO's agentview; set "
            "policy.pi05.camera_views"
        )
    return Pi05Layout(
        lineage=lineage,
        camera_keys=tuple(keys),
        camera_views=views,
        camera_order=_lerobot_order(keys, views) if lineage == "lerobot" else None,
        state_dim=state_dim,
        max_state_dim=_int(payload, "max_state_dim", d["state_dim"], config_path),
        action_horizon=horizon,
        n_action_steps=_int(payload, "n_action_steps", d["n_action_steps"], config_path),
        action_dim=_int(payload, "max_action_dim", d["action_dim"], config_path),
        output_action_dim=int(
            ((payload.get("output_features") or {}).get("action") or {}).get("shape", [0])[0]
            or d["output_action_dim"]
        ),
        max_token_len=_int(payload, "tokenizer_max_length", d["max_token_len"], config_path),
        source=directory,
        stats_path=stats_path,
        derived=derived,
    )
