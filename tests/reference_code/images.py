"""LeRobot's π0.5 image preprocessing (verbatim bodies, cited); needs torch, so it runs in the
SGLang side environment (``tests/sglang_side/worker.py`` ``lerobot_model_image``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812


def resize_with_pad_torch(
    images: torch.Tensor, height: int, width: int, mode: str = "bilinear"
) -> torch.Tensor:
    """lerobot 0.6.1 ``policies/common/vla_utils.py`` ``resize_with_pad_torch`` (lines 142-215;
    docstring and comments shortened)."""
    if images.shape[-1] <= 4:
        channels_last = True
        if images.dim() == 3:
            images = images.unsqueeze(0)
        images = images.permute(0, 3, 1, 2)
    else:
        channels_last = False
        if images.dim() == 3:
            images = images.unsqueeze(0)

    batch_size, channels, cur_height, cur_width = images.shape
    ratio = max(cur_width / width, cur_height / height)
    resized_height = int(cur_height / ratio)
    resized_width = int(cur_width / ratio)
    resized_images = F.interpolate(
        images,
        size=(resized_height, resized_width),
        mode=mode,
        align_corners=False if mode == "bilinear" else None,
    )
    if images.dtype == torch.uint8:
        resized_images = torch.round(resized_images).clamp(0, 255).to(torch.uint8)
    elif images.dtype == torch.float32:
        resized_images = resized_images.clamp(0.0, 1.0)
    else:
        raise ValueError(f"Unsupported image dtype: {images.dtype}")
    pad_h0, remainder_h = divmod(height - resized_height, 2)
    pad_h1 = pad_h0 + remainder_h
    pad_w0, remainder_w = divmod(width - resized_width, 2)
    pad_w1 = pad_w0 + remainder_w
    constant_value = 0 if images.dtype == torch.uint8 else 0.0
    padded_images = F.pad(
        resized_images,
        (pad_w0, pad_w1, pad_h0, pad_h1),
        mode="constant",
        value=constant_value,
    )
    if channels_last:
        padded_images = padded_images.permute(0, 2, 3, 1)
    return padded_images


def lerobot_model_image(frame_uint8_hwc: torch.Tensor, size: int = 224) -> torch.Tensor:
    """What LeRobot's π0.5 feeds SigLIP for one raw LIBERO frame, [3, size, size] in [-1, 1]:
    ``preprocess_observation`` (uint8 HWC -> float32 CHW / 255), ``LiberoProcessorStep``
    (``torch.flip(img, dims=[2, 3])``, ``processor/env_processor.py:59``), then
    ``PI05Pytorch._preprocess_images`` (``modeling_pi05.py:986-997``: to HWC,
    ``resize_with_pad_torch``, ``* 2 - 1``, back to CHW)."""
    img = frame_uint8_hwc.permute(2, 0, 1).unsqueeze(0).type(torch.float32) / 255
    img = torch.flip(img, dims=[2, 3])
    img = img.permute(0, 2, 3, 1)
    if img.shape[1:3] != (size, size):
        img = resize_with_pad_torch(img, size, size)
    img = img * 2.0 - 1.0
    return img.permute(0, 3, 1, 2)[0]
