"""The reference server's own check of the images a client sends (self-test, privileged state).

The scripted expert plans from privileged state and never looks at the images, so a client
that forgets the 180-degree flip, swaps the views or pads wrongly would pass the self-test.
With privileged state on, the env worker also sends the raw camera frames
(``privileged_state["camera_frames"]``); a family's part of the server prepares them by the
model's conventions, written from the model's specification and independent of the client's
code (the family's adapter), and refuses a request whose images differ. Here: what every
family's check shares (the frames, the comparison); the preprocessing is each family's.
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


def upright(frame: np.ndarray) -> Image.Image:
    """A raw LIBERO frame rotated 180 degrees (the renderer's frames are upside down)."""
    return Image.fromarray(np.ascontiguousarray(np.rot90(frame, 2)))


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
