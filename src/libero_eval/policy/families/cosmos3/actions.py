"""Pure action and observation math for Cosmos3 LIBERO policies (numpy, scipy, PIL; no HTTP).

Conventions (see docs/design.md):

- LIBERO action: ``float64[7] = [dx, dy, dz, ax, ay, az, gripper]``, axis-angle rotation delta,
  gripper -1 open / +1 close.
- Model action (Cosmos3, LIBERO domain): 10 channels ``[dxyz(3), rot6d(6), gripper(1)]``,
  quantile-normalized to [-1, 1]. rot6d holds the first two COLUMNS of the rotation matrix,
  ``R[:, 0]`` then ``R[:, 1]``. Gripper ``g`` in [0, 1] with g = 1 open, g = 0 closed.
- ``quantile_rot`` (de-)normalizes all 10 channels with the stats file's ``global_raw`` block,
  ``quantile`` with its ``global`` block: ``a = (a_norm + 1) / 2 * (q99 - q01) + q01``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from libero_eval import package_data
from libero_eval.policy.families.cosmos3.settings import DEFAULTS

MODEL_ACTION_DIM = 10
# policy.cosmos3's defaults (the schema's), for callers that give no value
COSMOS3 = DEFAULTS
LIBERO_ACTION_DIM = 7
NORMALIZATION_BLOCKS = {"quantile_rot": "global_raw", "quantile": "global"}
ORTHONORMALIZATIONS = ("gram_schmidt", "svd")
GRIPPER_MAPPINGS = ("binary", "continuous")
QUANTILE_RANGE_FLOOR = 1e-8
PROMPT_VIEW_SUFFIX = (
    " This video contains concatenated views from multiple camera perspectives."
    " The left half shows the third-person view; the right half shows the wrist-mounted camera."
)

Orthonormalization = Literal["gram_schmidt", "svd"]
GripperMapping = Literal["binary", "continuous"]

_STATS_FIX = (
    "use a Cosmos3 LIBERO stats file with a '{block}' block holding q01 and q99 lists of "
    "{dim} finite numbers (e.g. libero_eval:stats/libero_native_frame_wise_relative_rot6d.json)"
)


# --------------------------------------------------------------------------------------------
# Stats and (de-)normalization
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ActionStats:
    """Per-channel quantiles of one block of a Cosmos3 action stats file."""

    q01: np.ndarray  # float64[dim]
    q99: np.ndarray  # float64[dim]
    source: Path
    block: str

    @property
    def dim(self) -> int:
        return int(self.q01.shape[0])


def stats_block_for(normalization: str) -> str:
    """Stats block used by a normalization: ``quantile_rot`` -> ``global_raw``, ``quantile`` ->
    ``global``."""
    try:
        return NORMALIZATION_BLOCKS[normalization]
    except KeyError:
        raise ValueError(
            f"unknown action normalization {normalization!r}; "
            f"use one of {sorted(NORMALIZATION_BLOCKS)}"
        ) from None


def load_action_stats(
    path: str | Path, block: str = "global_raw", expected_dim: int = MODEL_ACTION_DIM
) -> ActionStats:
    """Load and validate ``block``'s q01/q99 vectors from a Cosmos3 action stats JSON file
    (a path, or ``libero_eval:<name>`` for a file the package ships)."""
    path = package_data.resolve(path)
    fix = _STATS_FIX.format(block=block, dim=expected_dim)
    if not path.is_file():
        raise FileNotFoundError(f"action stats file {path} does not exist; {fix}")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"action stats file {path} is not readable JSON ({exc}); {fix}") from exc
    if not isinstance(content, dict) or not isinstance(content.get(block), dict):
        found = sorted(content) if isinstance(content, dict) else type(content).__name__
        raise ValueError(f"action stats file {path} has no '{block}' block (found {found}); {fix}")
    vectors = {}
    for key in ("q01", "q99"):
        value = content[block].get(key)
        where = f"action stats file {path}, block '{block}', key '{key}'"
        if not isinstance(value, list) or len(value) != expected_dim:
            shape = f"length {len(value)}" if isinstance(value, list) else repr(value)[:60]
            raise ValueError(
                f"{where}: expected a list of {expected_dim} numbers, got {shape}; {fix}"
            )
        if not all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            for x in value
        ):
            raise ValueError(f"{where}: all entries must be finite numbers, got {value}; {fix}")
        vectors[key] = np.asarray(value, dtype=np.float64)
    inverted = np.flatnonzero(vectors["q99"] < vectors["q01"])
    if inverted.size:
        raise ValueError(
            f"action stats file {path}, block '{block}': q99 < q01 in channel(s) "
            f"{inverted.tolist()}; {fix}"
        )
    return ActionStats(q01=vectors["q01"], q99=vectors["q99"], source=path, block=block)


def _check_channels(array: np.ndarray, stats: ActionStats, name: str) -> np.ndarray:
    array = np.asarray(array, dtype=np.float64)
    if array.ndim == 0 or array.shape[-1] != stats.dim:
        raise ValueError(
            f"{name} must have {stats.dim} channels in its last axis to match stats block "
            f"'{stats.block}' of {stats.source}, got shape {array.shape}"
        )
    return array


def denormalize_quantile(a_norm: np.ndarray, stats: ActionStats) -> np.ndarray:
    """``a = (a_norm + 1) / 2 * (q99 - q01) + q01`` per channel (last axis), float64."""
    a_norm = _check_channels(a_norm, stats, "normalized action")
    return (a_norm + 1.0) / 2.0 * (stats.q99 - stats.q01) + stats.q01


def normalize_quantile(a: np.ndarray, stats: ActionStats) -> np.ndarray:
    """Inverse of :func:`denormalize_quantile`, clipped to [-1, 1] (as SGLang's
    ``normalize_action``); the quantile range is floored at 1e-8 to avoid division by zero."""
    a = _check_channels(a, stats, "action")
    span = np.maximum(stats.q99 - stats.q01, QUANTILE_RANGE_FLOOR)
    return np.clip(2.0 * (a - stats.q01) / span - 1.0, -1.0, 1.0)


# --------------------------------------------------------------------------------------------
# Rotations
# --------------------------------------------------------------------------------------------


def _unit(vectors: np.ndarray, what: str) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    if np.any(norms < 1e-8):
        raise ValueError(
            f"rot6d is degenerate: {what} has (near-)zero norm; cannot build a rotation"
        )
    return vectors / norms


def rot6d_to_matrix(r6: np.ndarray, method: Orthonormalization = "gram_schmidt") -> np.ndarray:
    """rot6d ``[..., 6]`` (first two matrix COLUMNS c0 = r6[..., 0:3], c1 = r6[..., 3:6]) ->
    rotation matrices ``[..., 3, 3]``.

    ``gram_schmidt``: normalize c0; c1 -= (c1.c0) c0; normalize c1; c2 = c0 x c1; stack as
    columns. ``svd``: the rotation nearest (Frobenius) to ``[c0, c1, c0 x c1]``, with the
    determinant forced to +1. Both are exact for orthonormal input and invariant to positive
    per-column scaling.
    """
    r6 = np.asarray(r6, dtype=np.float64)
    if r6.ndim == 0 or r6.shape[-1] != 6:
        raise ValueError(f"rot6d must have shape [..., 6], got {r6.shape}")
    if not np.all(np.isfinite(r6)):
        raise ValueError("rot6d contains non-finite values (NaN or inf)")
    c0, c1 = r6[..., 0:3], r6[..., 3:6]
    if method == "gram_schmidt":
        c0 = _unit(c0, "column 0")
        c1 = c1 - np.sum(c1 * c0, axis=-1, keepdims=True) * c0
        c1 = _unit(c1, "column 1 after removing its column-0 component (columns are parallel)")
        return np.stack([c0, c1, np.cross(c0, c1)], axis=-1)
    if method == "svd":
        _unit(c0, "column 0")
        c2 = np.cross(c0, c1)
        _unit(c2, "column 0 x column 1 (columns are parallel)")
        u, _, vt = np.linalg.svd(np.stack([c0, c1, c2], axis=-1))
        # det([c0, c1, c0 x c1]) = |c0 x c1|^2 > 0, so the fix below is a safeguard only.
        det = np.linalg.det(u @ vt)
        fix = np.ones(u.shape[:-1])
        fix[..., -1] = np.sign(det)
        return (u * fix[..., None, :]) @ vt
    raise ValueError(f"unknown orthonormalization {method!r}; use one of {ORTHONORMALIZATIONS}")


def matrix_to_rot6d(matrices: np.ndarray) -> np.ndarray:
    """Rotation matrices ``[..., 3, 3]`` -> rot6d ``[..., 6]`` = ``[R[:, 0], R[:, 1]]``."""
    matrices = np.asarray(matrices, dtype=np.float64)
    if matrices.ndim < 2 or matrices.shape[-2:] != (3, 3):
        raise ValueError(f"rotation matrices must have shape [..., 3, 3], got {matrices.shape}")
    return np.concatenate([matrices[..., :, 0], matrices[..., :, 1]], axis=-1)


def rot6d_to_axis_angle(r6: np.ndarray, method: Orthonormalization = "gram_schmidt") -> np.ndarray:
    """rot6d ``[..., 6]`` -> rotation vectors (axis * angle, angle in [0, pi]) ``[..., 3]``."""
    matrices = rot6d_to_matrix(r6, method)
    lead = matrices.shape[:-2]
    from scipy.spatial.transform import Rotation  # lazy: the config check needs none

    rotvec = Rotation.from_matrix(matrices.reshape(-1, 3, 3)).as_rotvec()
    return rotvec.reshape(*lead, 3)


def axis_angle_to_rot6d(rotvec: np.ndarray) -> np.ndarray:
    """Rotation vectors ``[..., 3]`` -> rot6d ``[..., 6]``."""
    rotvec = np.asarray(rotvec, dtype=np.float64)
    if rotvec.ndim == 0 or rotvec.shape[-1] != 3:
        raise ValueError(f"axis-angle must have shape [..., 3], got {rotvec.shape}")
    lead = rotvec.shape[:-1]
    from scipy.spatial.transform import Rotation

    matrices = Rotation.from_rotvec(rotvec.reshape(-1, 3)).as_matrix()
    return matrix_to_rot6d(matrices.reshape(*lead, 3, 3))


# --------------------------------------------------------------------------------------------
# Gripper
# --------------------------------------------------------------------------------------------


def gripper_to_libero(g: np.ndarray, mapping: GripperMapping = "binary") -> np.ndarray:
    """Model gripper ``g`` in [0, 1] (1 open) -> LIBERO command (-1 open, +1 close).

    ``binary`` is RLinf's ``-sign(2g - 1)`` exactly: g < 0.5 -> +1, g > 0.5 -> -1, and
    g == 0.5 -> 0 (robosuite's Panda gripper acts on the sign only, so 0 holds the fingers).
    ``continuous`` is cosmos-framework's ``clip(1 - 2g, -1, 1)``.
    """
    g = np.asarray(g, dtype=np.float64)
    if not np.all(np.isfinite(g)):
        raise ValueError("gripper values contain non-finite values (NaN or inf)")
    if mapping == "binary":
        return -np.sign(2.0 * g - 1.0) + 0.0  # + 0.0: -0.0 becomes 0.0
    if mapping == "continuous":
        return np.clip(-(2.0 * g - 1.0), -1.0, 1.0)
    raise ValueError(f"unknown gripper mapping {mapping!r}; use one of {GRIPPER_MAPPINGS}")


def libero_gripper_to_unit(x: np.ndarray) -> np.ndarray:
    """LIBERO gripper command (-1 open, +1 close) -> model gripper in [0, 1]: ``(1 - x) / 2``."""
    return (1.0 - np.asarray(x, dtype=np.float64)) / 2.0


# --------------------------------------------------------------------------------------------
# Whole chunks
# --------------------------------------------------------------------------------------------


def model_chunk_to_libero(
    chunk: np.ndarray,
    stats: ActionStats,
    raw_action_dim: int = COSMOS3["raw_action_dim"],
    num_action_chunks: int = COSMOS3["num_action_chunks"],
    orthonormalization: Orthonormalization = COSMOS3["orthonormalization"],
    gripper_mapping: GripperMapping = COSMOS3["gripper_mapping"],
) -> np.ndarray:
    """One model output ``[H, D]`` (D >= raw_action_dim, may be padded) -> LIBERO actions
    ``float64[num_action_chunks, 7]``.

    Takes the first ``raw_action_dim`` channels, de-normalizes them with ``stats``, converts
    rot6d to axis-angle, maps the gripper and assembles ``[dxyz, axis_angle, gripper]``. Fewer
    than ``num_action_chunks`` rows are padded by repeating the last row; more are truncated.
    """
    if raw_action_dim != MODEL_ACTION_DIM:
        raise ValueError(
            f"raw_action_dim must be {MODEL_ACTION_DIM} for the [dxyz, rot6d, gripper] layout, "
            f"got {raw_action_dim}"
        )
    if num_action_chunks < 1:
        raise ValueError(f"num_action_chunks must be >= 1, got {num_action_chunks}")
    chunk = np.asarray(chunk)
    if chunk.ndim != 2 or chunk.shape[0] < 1 or chunk.shape[1] < raw_action_dim:
        raise ValueError(
            f"model action chunk must have shape [H >= 1, D >= {raw_action_dim}], got {chunk.shape}"
        )
    if chunk.dtype.kind not in "iuf":
        raise ValueError(f"model action chunk must be numeric, got dtype {chunk.dtype}")
    normalized = chunk[:, :raw_action_dim].astype(np.float64)
    if not np.all(np.isfinite(normalized)):
        bad_rows = np.flatnonzero(~np.all(np.isfinite(normalized), axis=1)).tolist()
        raise ValueError(f"model action chunk has non-finite values in row(s) {bad_rows}")
    actions = denormalize_quantile(normalized, stats)
    libero = np.concatenate(
        [
            actions[:, 0:3],
            rot6d_to_axis_angle(actions[:, 3:9], orthonormalization),
            gripper_to_libero(actions[:, 9:10], gripper_mapping),
        ],
        axis=1,
    )
    if libero.shape[0] >= num_action_chunks:
        return libero[:num_action_chunks]
    padding = np.repeat(libero[-1:], num_action_chunks - libero.shape[0], axis=0)
    return np.concatenate([libero, padding], axis=0)


def libero_to_model_chunk(actions: np.ndarray, stats: ActionStats) -> np.ndarray:
    """LIBERO actions ``[H, 7]`` -> normalized model actions ``float32[H, 10]`` (the inverse of
    :func:`model_chunk_to_libero` up to the binary gripper's sign and the [-1, 1] clip)."""
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[1] != LIBERO_ACTION_DIM:
        raise ValueError(f"LIBERO actions must have shape [H, 7], got {actions.shape}")
    if not np.all(np.isfinite(actions)):
        raise ValueError("LIBERO actions contain non-finite values (NaN or inf)")
    raw = np.concatenate(
        [
            actions[:, 0:3],
            axis_angle_to_rot6d(actions[:, 3:6]),
            libero_gripper_to_unit(actions[:, 6:7]),
        ],
        axis=1,
    )
    return normalize_quantile(raw, stats).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Observation
# --------------------------------------------------------------------------------------------


def _check_camera_image(image: np.ndarray, name: str) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(
            f"{name} image must be uint8 [H, W, 3] as LIBERO renders it, "
            f"got {image.dtype} {image.shape}"
        )
    return image


def preprocess_observation_image(
    agentview: np.ndarray, wrist: np.ndarray, width: int = 320, height: int = 192
) -> np.ndarray:
    """Build the Cosmos3 LIBERO input image ``uint8[height, width, 3]`` from the two raw cameras.

    1. Rotate each camera image 180 degrees (``img[::-1, ::-1]``; LIBERO renders upside down).
    2. Concatenate side by side, agentview left, wrist right (256x256 each -> 256x512).
    3. Scale by ``s = min(width / W, height / H, 1)`` (never upscale) to
       ``(round(s * W), round(s * H))`` with PIL bicubic (256x512 -> 160x320).
    4. Pad bottom and right up to ``height x width`` with ``np.pad(mode="reflect")`` (mirror
       without repeating the edge row); if a pad is not smaller than the content it pads,
       ``mode="edge"`` instead, as RLinf's Cosmos3 adapter does. 160x320 -> 192x320 reflects
       rows 158..127 below row 159.
    """
    agentview = _check_camera_image(agentview, "agentview")
    wrist = _check_camera_image(wrist, "wrist")
    if agentview.shape[0] != wrist.shape[0]:
        raise ValueError(
            f"agentview and wrist images need the same height to be concatenated, "
            f"got {agentview.shape} and {wrist.shape}"
        )
    if width < 1 or height < 1:
        raise ValueError(f"target size must be positive, got {width}x{height} (W x H)")
    concat = np.concatenate([agentview[::-1, ::-1], wrist[::-1, ::-1]], axis=1)
    src_h, src_w = concat.shape[:2]
    scale = min(width / src_w, height / src_h, 1.0)
    new_w = max(1, min(width, int(scale * src_w + 0.5)))
    new_h = max(1, min(height, int(scale * src_h + 0.5)))
    if (new_w, new_h) != (src_w, src_h):
        resized = Image.fromarray(concat).resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
        concat = np.asarray(resized, dtype=np.uint8)
    pad_h, pad_w = height - new_h, width - new_w
    if pad_h or pad_w:
        mode = "edge" if (pad_h and pad_h >= new_h) or (pad_w and pad_w >= new_w) else "reflect"
        concat = np.pad(concat, ((0, pad_h), (0, pad_w), (0, 0)), mode=mode)
    return np.ascontiguousarray(concat, dtype=np.uint8)


def augment_prompt(task_language: str) -> str:
    """Task language + "." if missing + the concatenated-views sentence Cosmos3 LIBERO saw in
    training (:data:`PROMPT_VIEW_SUFFIX`)."""
    if not isinstance(task_language, str) or not task_language.strip():
        raise ValueError(f"task language must be a non-empty string, got {task_language!r}")
    prompt = task_language.rstrip()
    if not prompt.endswith("."):
        prompt += "."
    return prompt + PROMPT_VIEW_SUFFIX
