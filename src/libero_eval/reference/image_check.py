"""The reference server's own check of the images a client sends (self-test, privileged state).

The scripted expert plans from privileged state and never looks at the images, so a client
that forgets the 180-degree flip, swaps the views or pads wrongly would pass the self-test.
With privileged state on, the env worker also sends the raw camera frames
(``privileged_state["camera_frames"]``); the server prepares them by the model's conventions,
written here from the model families' specifications and independent of the client's code
(``libero_eval.policy``), and refuses a request whose images differ.

- Cosmos3 (LIBERO): both cameras rotated 180 degrees, side by side with agentview on the left,
  scaled down keeping the aspect (PIL bicubic, never up), reflect-padded bottom and right.
- π0.5 (openpi LIBERO): each camera rotated 180 degrees and resized with padding (PIL bilinear,
  zeros centred, as ``openpi_client.image_tools.resize_with_pad``); base = agentview, left
  wrist = wrist, right wrist = zeros with mask False.
- π0.5 (LeRobot LIBERO): each camera rotated 180 degrees, unresized (the model resizes), under
  the checkpoint's camera names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

#: mean absolute difference (grey levels) above which images count as different
MAX_MEAN_ABS_DIFF = 0.5


class ImageCheckError(ValueError):
    """The client's image is not the model's preprocessing of the raw camera frames."""


def camera_frames(privileged_state: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The raw (upside-down) agentview and wrist frames, if the client sent them."""
    frames = (privileged_state or {}).get("camera_frames")
    if not isinstance(frames, dict):
        return None
    try:
        agentview = np.asarray(frames["agentview"], dtype=np.uint8)
        wrist = np.asarray(frames["wrist"], dtype=np.uint8)
    except (KeyError, TypeError, ValueError) as exc:
        raise ImageCheckError(
            f"privileged_state.camera_frames needs uint8 'agentview' and 'wrist' frames ({exc})"
        ) from exc
    return agentview, wrist


def _upright(frame: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(np.rot90(frame, 2)))


def cosmos3_image(agentview: np.ndarray, wrist: np.ndarray, width: int, height: int) -> np.ndarray:
    """Cosmos3's LIBERO input image ``uint8[height, width, 3]`` from the raw frames."""
    left, right = _upright(agentview), _upright(wrist)
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


def pi05_image(frame: np.ndarray, size: int) -> np.ndarray:
    """openpi's LIBERO camera image ``uint8[size, size, 3]`` from one raw frame."""
    image = _upright(frame)
    if image.size == (size, size):
        return np.asarray(image)
    ratio = max(image.width / size, image.height / size)
    new_w, new_h = int(image.width / ratio), int(image.height / ratio)
    resized = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", (size, size))
    canvas.paste(resized, (int((size - new_w) / 2), int((size - new_h) / 2)))
    return np.asarray(canvas)


def lerobot_image(frame: np.ndarray) -> np.ndarray:
    """LeRobot's LIBERO camera image (``LiberoProcessorStep``: both axes flipped), uint8."""
    return np.ascontiguousarray(np.rot90(frame, 2))


def compare(received: Any, expected: np.ndarray, what: str, convention: str) -> None:
    """Raise :class:`ImageCheckError` when ``received`` is not ``expected``."""
    received = np.asarray(received)
    if received.shape != expected.shape:
        raise ImageCheckError(
            f"image check failed for {what}: the client sent shape {list(received.shape)}, "
            f"the model takes {list(expected.shape)} ({convention})"
        )
    diff = np.abs(received.astype(np.int16) - expected.astype(np.int16))
    if diff.mean() > MAX_MEAN_ABS_DIFF:
        flipped = np.abs(received.astype(np.int16) - expected[::-1, ::-1].astype(np.int16))
        hint = (
            " It matches the frame rotated once more: is the 180-degree flip missing?"
            if flipped.mean() <= MAX_MEAN_ABS_DIFF
            else ""
        )
        raise ImageCheckError(
            f"image check failed for {what}: mean difference {diff.mean():.1f} grey levels "
            f"(max {int(diff.max())}) from the server's own preprocessing of the raw camera "
            f"frames ({convention}).{hint} Check the client's image conventions"
        )
