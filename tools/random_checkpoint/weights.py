"""Random weights as safetensors shards (torch + safetensors; on the GPU where there is one)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .sglang_models import Tensor
from .specs import SEED


def init_tensor(row: Tensor, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """N(0, 0.02) for matrices and kernels; 1 for 1-D norm weights; 0 for other 1-D tensors;
    integer buffers (position ids) count up along their last axis."""
    if not row.dtype.is_floating_point:
        last = row.shape[-1] if row.shape else 1
        return torch.arange(last, dtype=row.dtype).expand(row.shape).contiguous()
    if len(row.shape) >= 2:
        t = torch.empty(row.shape, dtype=row.dtype, device=device)
        return t.normal_(0.0, 0.02, generator=generator)
    if "norm" in row.name and row.name.endswith("weight"):
        return torch.ones(row.shape, dtype=row.dtype, device=device)
    return torch.zeros(row.shape, dtype=row.dtype, device=device)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def write_shards(
    rows: list[Tensor],
    directory: Path,
    stem: str,
    *,
    shard_bytes: int = 4 << 30,
    index_name: str | None = None,
    device: torch.device | None = None,
    seed: int = SEED,
) -> dict[str, int]:
    """Write ``rows`` as ``{stem}.safetensors`` or ``{stem}-0000i-of-0000n.safetensors`` plus
    an index (``index_name``) when more than one shard is needed; returns byte and shard
    counts."""
    device = device or default_device()
    generator = torch.Generator(device=device).manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    shards: list[list[Tensor]] = [[]]
    size = 0
    for row in rows:
        nbytes = row.numel * torch.empty((), dtype=row.dtype).element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(row)
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        name = (
            f"{stem}.safetensors"
            if len(shards) == 1
            else (f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors")
        )
        tensors = {}
        for row in shard:
            tensors[row.name] = init_tensor(row, device, generator).cpu()
            weight_map[row.name] = name
            total += tensors[row.name].numel() * tensors[row.name].element_size()
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        del tensors
    if len(shards) > 1 and index_name:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / index_name).write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    return {"bytes": total, "shards": len(shards)}
