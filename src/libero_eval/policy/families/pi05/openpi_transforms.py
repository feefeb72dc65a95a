"""openpi's LIBERO transforms for π0.5, client side (numpy and PIL; no HTTP).

What openpi does, and where (Physical-Intelligence/openpi):

- ``examples/libero/main.py``: both camera images rotated 180 degrees (``img[::-1, ::-1]``),
  ``openpi_client.image_tools.resize_with_pad`` to 224x224 (PIL bilinear, zero padding
  centred), state = ``eef_pos (3) + quat2axisangle(eef_quat) (3) + gripper_qpos (2)``.
- ``src/openpi/policies/libero_policy.py``: ``base_0_rgb`` = agentview, ``left_wrist_0_rgb``
  = wrist, ``right_wrist_0_rgb`` = zeros with mask False (π0 / π0.5); ``actions[..., :7]`` out.
- ``src/openpi/transforms.py``: ``Normalize`` / ``Unnormalize`` with the checkpoint's
  ``assets/<asset_id>/norm_stats.json``; quantile for π0.5
  ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`` and ``(x + 1) / 2 * (q99 - q01 + 1e-6) + q01``,
  z-score ``(x - mean) / (std + 1e-6)`` and ``x * (std + 1e-6) + mean``; stats may be shorter
  than the vector (the rest passes through). ``PadStatesAndActions`` zero-pads to the model dim.

LeRobot checkpoints keep their statistics in the normalizer processor's safetensors file
(``policy_preprocessor_step_*_normalizer_processor.safetensors``, keys ``observation.state.q01``,
``action.q99``, ...) or a dataset ``stats.json``; LeRobot's formulas have no ``1e-6`` in the
quantile range (``2 (x - q01) / (q99 - q01) - 1``, eps 1e-8 only where q99 == q01) and
``eps = 1e-8`` in the z-score. :func:`load_norm_stats` records which convention a file uses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image

from libero_eval import package_data

LIBERO_STATE_DIM = 8  # eef_pos (3) + axis-angle (3) + gripper qpos (2)
LIBERO_ACTION_DIM = 7
OPENPI_EPS = 1e-6
LEROBOT_EPS = 1e-8
IMAGE_KEYS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")

Normalization = Literal["quantile", "zscore"]
Convention = Literal["openpi", "lerobot"]

_STATS_FIX = (
    "use the checkpoint's own statistics: openpi's assets/<asset_id>/norm_stats.json "
    '({"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}), a LeRobot '
    "normalizer *.safetensors file or a LeRobot stats.json (e.g. "
    "libero_eval:stats/pi05_libero_norm_stats.json for tests)"
)


# --------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------


def rotate_180(image: np.ndarray) -> np.ndarray:
    """LIBERO renders upside down; openpi trains on ``img[::-1, ::-1]``."""
    return np.ascontiguousarray(image[::-1, ::-1])


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """One uint8 ``[H, W, 3]`` image resized as ``openpi_client.image_tools.resize_with_pad``:
    keep the aspect ratio (``ratio = max(W / width, H / height)``, sizes truncated with
    ``int``), PIL bilinear, pasted on zeros at ``int((size - resized) / 2)``; an image already
    of the target size is returned unchanged."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"resize_with_pad needs a uint8 [H, W, 3] image, got {image.dtype} {image.shape}"
        )
    cur_height, cur_width = image.shape[:2]
    if (cur_height, cur_width) == (height, width):
        return image
    ratio = max(cur_width / width, cur_height / height)
    resized_height = int(cur_height / ratio)
    resized_width = int(cur_width / ratio)
    resized = Image.fromarray(image).resize(
        (resized_width, resized_height), resample=Image.BILINEAR
    )
    canvas = Image.new(resized.mode, (width, height), 0)
    pad_height = max(0, int((height - resized_height) / 2))
    pad_width = max(0, int((width - resized_width) / 2))
    canvas.paste(resized, (pad_width, pad_height))
    return np.asarray(canvas)


def libero_images(agentview: np.ndarray, wrist: np.ndarray, size: int) -> dict[str, np.ndarray]:
    """openpi's LIBERO images: both rotated 180 degrees and resized with padding to size x size
    (``examples/libero/main.py``), keyed for the model (``libero_policy.py``); the right wrist
    is zeros (its mask is False, see :func:`image_masks`)."""
    base = resize_with_pad(rotate_180(agentview), size, size)
    left = resize_with_pad(rotate_180(wrist), size, size)
    return {
        "base_0_rgb": base,
        "left_wrist_0_rgb": left,
        "right_wrist_0_rgb": np.zeros_like(base),
    }


def image_masks() -> dict[str, bool]:
    """π0 / π0.5 masks of ``libero_policy.LiberoInputs`` (the padded right wrist is masked)."""
    return {"base_0_rgb": True, "left_wrist_0_rgb": True, "right_wrist_0_rgb": False}


# --------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """robosuite's ``quat2axisangle`` (x, y, z, w), as openpi's LIBERO example copies it:
    w clipped to [-1, 1], zeros for a (near) zero rotation."""
    quat = np.array(quat, dtype=np.float64)
    if quat.shape != (4,):
        raise ValueError(f"eef quaternion must have 4 entries (x, y, z, w), got {quat.shape}")
    quat[3] = min(1.0, max(-1.0, quat[3]))
    den = np.sqrt(1.0 - quat[3] * quat[3])
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return (quat[:3] * 2.0 * math.acos(quat[3])) / den


def libero_state(eef_pos: Any, eef_quat: Any, gripper_qpos: Any) -> np.ndarray:
    """openpi's 8-D LIBERO state: eef position, axis-angle orientation, gripper joints."""
    parts = {
        "eef_pos": (np.asarray(eef_pos, dtype=np.float64), 3),
        "gripper_qpos": (np.asarray(gripper_qpos, dtype=np.float64), 2),
    }
    for name, (value, size) in parts.items():
        if value.shape != (size,):
            raise ValueError(f"robot {name} must have {size} entries, got shape {value.shape}")
    return np.concatenate(
        [parts["eef_pos"][0], quat_to_axis_angle(eef_quat), parts["gripper_qpos"][0]]
    )


def pad_to_dim(vector: np.ndarray, dim: int) -> np.ndarray:
    """Zero-pad the last axis to ``dim`` (openpi ``pad_to_dim``); longer vectors are an error."""
    vector = np.asarray(vector)
    if vector.shape[-1] > dim:
        raise ValueError(f"cannot pad a vector of {vector.shape[-1]} entries to {dim}")
    pad = [(0, 0)] * (vector.ndim - 1) + [(0, dim - vector.shape[-1])]
    return np.pad(vector, pad)


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StatsBlock:
    """Per-channel statistics of one feature (state or actions)."""

    mean: np.ndarray | None
    std: np.ndarray | None
    q01: np.ndarray | None
    q99: np.ndarray | None

    @property
    def dim(self) -> int:
        for value in (self.q01, self.mean, self.q99, self.std):
            if value is not None:
                return int(value.shape[0])
        return 0


@dataclass(frozen=True, eq=False)
class NormStats:
    """A checkpoint's normalization statistics and the formulas its framework uses."""

    state: StatsBlock
    actions: StatsBlock
    source: Path
    convention: Convention
    # the checkpoint's own choice where it records one (LeRobot's policy_preprocessor.json
    # norm_map), as "quantile" / "zscore" / another LeRobot mode name; None when unrecorded
    state_mode: str | None = None
    actions_mode: str | None = None


LEROBOT_MODES = {"QUANTILES": "quantile", "MEAN_STD": "zscore"}


def _lerobot_normalizer(directory: Path) -> tuple[Path, dict[str, str]] | None:
    """The normalizer step of a LeRobot checkpoint's ``policy_preprocessor.json``: its state
    file and its ``norm_map`` (feature type -> mode)."""
    config_path = directory / "policy_preprocessor.json"
    if not config_path.is_file():
        return None
    try:
        steps = json.loads(config_path.read_text(encoding="utf-8")).get("steps", [])
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{config_path} is not readable JSON ({exc})") from exc
    for step in steps:
        if isinstance(step, dict) and step.get("registry_name") == "normalizer_processor":
            state_file = step.get("state_file")
            norm_map = (step.get("config") or {}).get("norm_map") or {}
            if state_file:
                return directory / state_file, {str(k): str(v) for k, v in norm_map.items()}
    return None


def _vector(value: Any, where: str) -> np.ndarray | None:
    if value is None:
        return None
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 2 and array.shape[0] == 1:  # LeRobot keeps some stats as [1, D]
        array = array[0]
    if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)):
        raise ValueError(
            f"{where} must be a non-empty list of finite numbers, got shape {array.shape}"
        )
    return array


def _block(raw: Any, where: str) -> StatsBlock:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a mapping with mean/std/q01/q99, got {raw!r:.80}")
    vectors = {
        key: _vector(raw.get(key), f"{where}.{key}") for key in ("mean", "std", "q01", "q99")
    }
    sizes = {key: v.shape[0] for key, v in vectors.items() if v is not None}
    if not sizes:
        raise ValueError(f"{where} has none of mean, std, q01, q99")
    if len(set(sizes.values())) > 1:
        raise ValueError(f"{where}: mean/std/q01/q99 differ in length: {sizes}")
    return StatsBlock(**vectors)


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _lerobot_blocks(flat: dict[str, Any], path: Path) -> tuple[dict, dict]:
    """``{"observation.state.q01": ...}`` (normalizer state dict) or nested stats.json."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if isinstance(value, dict):
            nested.setdefault(key, {}).update(value)
            continue
        feature, _, stat = key.rpartition(".")
        nested.setdefault(feature, {})[stat] = value
    missing = [name for name in ("observation.state", "action") if name not in nested]
    if missing:
        raise ValueError(
            f"statistics file {path} has no {', '.join(repr(m) for m in missing)} block "
            f"(found {sorted(nested)}); {_STATS_FIX}"
        )
    return nested["observation.state"], nested["action"]


def load_norm_stats(path: str | Path) -> NormStats:
    """Load a checkpoint's state/action statistics.

    Accepts openpi's ``norm_stats.json`` (or the ``assets/<asset_id>/`` directory holding it),
    a LeRobot normalizer ``*.safetensors`` file, or a LeRobot ``stats.json``; a path, or
    ``libero_eval:<name>`` for a file the package ships.
    """
    path = package_data.resolve(path)
    modes: dict[str, str] = {}
    if path.is_dir() and (normalizer := _lerobot_normalizer(path)) is not None:
        path, norm_map = normalizer
        modes = {
            block: LEROBOT_MODES.get(norm_map.get(kind, ""), norm_map.get(kind, "IDENTITY"))
            for block, kind in (("state", "STATE"), ("actions", "ACTION"))
        }
    if path.is_dir():
        candidates = [path / "norm_stats.json", *sorted(path.glob("*normalizer*.safetensors"))]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise FileNotFoundError(
                f"statistics directory {path} holds no norm_stats.json and no LeRobot "
                f"normalizer *.safetensors file; {_STATS_FIX}"
            )
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"statistics file {path} does not exist; {_STATS_FIX}")
    if path.suffix == ".safetensors":
        try:
            content: Any = _read_safetensors(path)
        except Exception as exc:
            raise ValueError(f"statistics file {path} is not readable safetensors ({exc})") from exc
        state_raw, actions_raw = _lerobot_blocks(content, path)
        convention: Convention = "lerobot"
    else:
        try:
            content = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(
                f"statistics file {path} is not readable JSON ({exc}); {_STATS_FIX}"
            ) from exc
        if not isinstance(content, dict):
            raise ValueError(f"statistics file {path} must hold a JSON object; {_STATS_FIX}")
        if "norm_stats" in content:
            blocks = content["norm_stats"]
            missing = [
                b for b in ("state", "actions") if not isinstance(blocks, dict) or b not in blocks
            ]
            if missing:
                found = sorted(blocks) if isinstance(blocks, dict) else type(blocks).__name__
                raise ValueError(
                    f"statistics file {path}: norm_stats has no "
                    f"{' and no '.join(repr(m) for m in missing)} block (found {found}); "
                    f"{_STATS_FIX}"
                )
            state_raw, actions_raw = blocks["state"], blocks["actions"]
            convention = "openpi"
        else:
            state_raw, actions_raw = _lerobot_blocks(content, path)
            convention = "lerobot"
    prefix = f"statistics file {path}"
    try:
        state = _block(state_raw, f"{prefix}: state")
        actions = _block(actions_raw, f"{prefix}: actions")
    except ValueError as exc:
        raise ValueError(f"{exc}; {_STATS_FIX}") from None
    return NormStats(
        state=state,
        actions=actions,
        source=path,
        convention=convention,
        state_mode=modes.get("state"),
        actions_mode=modes.get("actions"),
    )


def check_stats(
    stats: NormStats, normalization: Normalization, state_dim: int, action_dim: int
) -> None:
    """Stats usable for ``normalization`` of a ``state_dim`` state and ``action_dim`` actions."""
    keys = ("q01", "q99") if normalization == "quantile" else ("mean", "std")
    for name, mode in (("state", stats.state_mode), ("actions", stats.actions_mode)):
        if mode is not None and mode != normalization:
            fix = (
                f"set policy.pi05.normalization: {mode}"
                if mode in LEROBOT_MODES.values()
                else "this normalization is not supported"
            )
            raise ValueError(
                f"the checkpoint's policy_preprocessor.json normalizes the {name} with {mode}, "
                f"not {normalization}: {fix}"
            )
    for name, block, dim in (
        ("state", stats.state, state_dim),
        ("actions", stats.actions, action_dim),
    ):
        absent = [key for key in keys if getattr(block, key) is None]
        if absent:
            raise ValueError(
                f"statistics file {stats.source}: the {name} block has no "
                f"{'/'.join(absent)}, needed by {normalization} normalization; {_STATS_FIX}"
            )
        if block.dim < dim:
            raise ValueError(
                f"statistics file {stats.source}: the {name} block has {block.dim} channels, "
                f"fewer than the {dim} of LIBERO's {name}; these are not LIBERO statistics. "
                f"{_STATS_FIX}"
            )
        if normalization == "quantile" and np.any(block.q99 < block.q01):
            raise ValueError(
                f"statistics file {stats.source}: {name} q99 < q01 in channel(s) "
                f"{np.flatnonzero(block.q99 < block.q01).tolist()}; {_STATS_FIX}"
            )


def normalize(
    x: np.ndarray, block: StatsBlock, normalization: Normalization, convention: Convention
) -> np.ndarray:
    """Model-space value of ``x`` (its last axis uses the first ``x.shape[-1]`` stats)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    if normalization == "quantile":
        q01, q99 = block.q01[:d], block.q99[:d]
        if convention == "openpi":
            return (x - q01) / (q99 - q01 + OPENPI_EPS) * 2.0 - 1.0
        span = np.where(q99 - q01 == 0, LEROBOT_EPS, q99 - q01)
        return 2.0 * (x - q01) / span - 1.0
    mean, std = block.mean[:d], block.std[:d]
    eps = OPENPI_EPS if convention == "openpi" else LEROBOT_EPS
    return (x - mean) / (std + eps)


def unnormalize(
    x: np.ndarray, block: StatsBlock, normalization: Normalization, convention: Convention
) -> np.ndarray:
    """Inverse of :func:`normalize` on the first ``block.dim`` channels of ``x``; channels
    beyond the statistics pass through (openpi ``Unnormalize``)."""
    x = np.asarray(x, dtype=np.float64)
    d = min(block.dim, x.shape[-1])
    head, tail = x[..., :d], x[..., d:]
    if normalization == "quantile":
        q01, q99 = block.q01[:d], block.q99[:d]
        if convention == "openpi":
            head = (head + 1.0) / 2.0 * (q99 - q01 + OPENPI_EPS) + q01
        else:
            span = np.where(q99 - q01 == 0, LEROBOT_EPS, q99 - q01)
            head = (head + 1.0) * span / 2.0 + q01
    else:
        mean, std = block.mean[:d], block.std[:d]
        head = head * (std + OPENPI_EPS) + mean if convention == "openpi" else head * std + mean
    return np.concatenate([head, tail], axis=-1)
