"""Build and check random-weight checkpoints of SGLang 0.5.23's Cosmos3 and π0.5 (SGLang env)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from . import specs, text_tokenizers
from .sglang_models import (
    cosmos3_tensors,
    init_sglang,
    is_tiny_pi05,
    pi05_tensors,
    pi05_tiny_variants,
)
from .specs import SEED
from .weights import default_device, write_shards

MANIFEST = "random_checkpoint.json"
WARNING = (
    "RANDOM WEIGHTS: the architecture is SGLang's, the weights are N(0, 0.02). "
    "Policy outcomes are meaningless; timings and memory are those of the architecture."
)


def _params(rows) -> int:
    return sum(r.numel for r in rows)


def _bytes(rows) -> int:
    return sum(r.numel * torch.empty((), dtype=r.dtype).element_size() for r in rows)


def build_cosmos3(
    out: Path,
    size: str,
    qwen_tiktoken: Path | None = None,
    device: torch.device | None = None,
    weights: bool = True,
) -> dict[str, Any]:
    """A Cosmos3OmniDiffusersPipeline directory: model_index.json, transformer/, vae/,
    scheduler/, text_tokenizer/ (Qwen2's real BPE). ``weights=False``: everything but the
    safetensors (parameter counts from the meta-device models)."""
    started = time.monotonic()
    device = device or default_device()
    specs.write_cosmos3_configs(out, size)
    vocab = text_tokenizers.build_qwen2(
        out / "text_tokenizer", text_tokenizers.find_qwen_tiktoken(qwen_tiktoken)
    )
    tensors = cosmos3_tensors(out)
    stem = "diffusion_pytorch_model"
    transformer = {"bytes": _bytes(tensors["transformer"]), "shards": 0}
    vae = {"bytes": _bytes(tensors["vae"]), "shards": 0}
    if weights:
        transformer = write_shards(
            tensors["transformer"], out / "transformer", stem,
            index_name=f"{stem}.safetensors.index.json", device=device,
        )  # fmt: skip
        vae = write_shards(tensors["vae"], out / "vae", stem, shard_bytes=1 << 62, device=device)
    report = {
        "family": "cosmos3",
        "size": size,
        "pipeline_class_name": "Cosmos3OmniDiffusersPipeline",
        "transformer_parameters": _params(tensors["transformer"]),
        "vae_parameters": _params(tensors["vae"]),
        "transformer_bytes": transformer["bytes"],
        "transformer_shards": transformer["shards"],
        "vae_bytes": vae["bytes"],
        "text_tokenizer": f"Qwen2 BPE from qwen.tiktoken ({vocab} tokens with specials)",
    }
    return _finish(out, report, device, started, weights)


def build_pi05(
    out: Path,
    lineage: str,
    size: str,
    norm_stats: Path | None = None,
    hf_home: Path | None = None,
    device: torch.device | None = None,
    weights: bool = True,
    normalization: str = "QUANTILES",
    seed: int = SEED,
) -> dict[str, Any]:
    """A π0.5 directory of one lineage: config.json (+ LeRobot's policy_preprocessor.json or
    openpi's assets/) and model.safetensors; the PaliGemma tokenizer stand-in beside it in
    ``paligemma_tokenizer_standin/``, and in ``hf_home``'s hub cache when given."""
    started = time.monotonic()
    device = device or default_device()
    specs.write_pi05_configs(out, lineage, size, norm_stats, normalization)
    with pi05_tiny_variants() if size == "tiny" else _nothing():
        rows = pi05_tensors(out, lineage)
    written = {"bytes": _bytes(rows)}
    if weights:
        written = write_shards(rows, out, "model", shard_bytes=1 << 62, device=device, seed=seed)
    tokenizer_dir = out / "paligemma_tokenizer_standin"
    vocab = text_tokenizers.build_paligemma_standin(tokenizer_dir)
    if hf_home is not None:
        text_tokenizers.place_in_hf_cache(tokenizer_dir, hf_home, specs.PALIGEMMA_REPO)
    report = {
        "family": "pi05",
        "lineage": lineage,
        "size": size,
        "pipeline_class_name": "Pi05Pipeline",
        "parameters": _params(rows),
        "bytes": written["bytes"],
        "tokenizer": (
            f"STAND-IN for {specs.PALIGEMMA_REPO}: word level, {vocab} tokens "
            "(paligemma_tokenizer_standin/README.md)"
        ),
        "hf_cache": str(hf_home) if hf_home else None,
    }
    if size == "tiny":
        report["note"] = (
            "tiny π0.5 names variants SGLang does not know: it loads only under "
            "sglang_models.pi05_tiny_variants (loader tests); serve the true size"
        )
    return _finish(out, report, device, started, weights, seed)


def _finish(
    out: Path,
    report: dict[str, Any],
    device: torch.device,
    started: float,
    weights: bool,
    seed: int = SEED,
) -> dict:
    report.update(
        weights=f"random N(0, 0.02), norms 1, seed {seed}" if weights else "none (--no-weights)",
        device=str(device),
        seconds=round(time.monotonic() - started, 1),
        warning=WARNING,
    )
    (out / MANIFEST).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# --- loading with SGLang's own loaders ------------------------------------------------------


def verify_cosmos3(checkpoint: Path) -> dict[str, Any]:
    """Load transformer/ and vae/ with SGLang's TransformerLoader and VAELoader (no native
    fallback) on this machine's device; returns the loaded parameter counts."""
    from sglang.multimodal_gen.runtime.loader.component_loaders.transformer_loader import (
        TransformerLoader,
    )
    from sglang.multimodal_gen.runtime.loader.component_loaders.vae_loader import VAELoader

    args = init_sglang(checkpoint, "Cosmos3OmniDiffusersPipeline")
    args.model_paths = dict(getattr(args, "model_paths", {}) or {})
    result: dict[str, Any] = {"family": "cosmos3"}
    for name, loader in (("transformer", TransformerLoader()), ("vae", VAELoader())):
        model, _ = loader.load(
            str(checkpoint / name), args, name, "diffusers", allow_native_fallback=False
        )
        params = list(model.parameters())
        result[f"{name}_class"] = type(model).__name__
        result[f"{name}_parameters"] = sum(p.numel() for p in params)
        result[f"{name}_all_finite"] = all(bool(torch.isfinite(p).all()) for p in params)
        result[f"{name}_std"] = float(
            torch.cat([p.detach().flatten().float()[:4096] for p in params if p.ndim >= 2]).std()
        )
    return result


def verify_pi05(checkpoint: Path, hf_home: Path | None = None) -> dict[str, Any]:
    """Load the checkpoint with ``Pi05PolicyModel.from_pretrained`` (it refuses missing or
    mismatched weights) and build one LIBERO prompt with SGLang's own Pi05Preprocessor."""
    from sglang.multimodal_gen.runtime.models.vlas.pi05_policy import Pi05PolicyModel

    if hf_home is not None and os.environ.get("HF_HOME") != str(hf_home):
        raise ValueError("set HF_HOME before importing huggingface_hub (the CLI does)")
    args = init_sglang(checkpoint, "Pi05Pipeline")
    config = args.pipeline_config
    with pi05_tiny_variants() if is_tiny_pi05(checkpoint) else _nothing():
        model = Pi05PolicyModel.from_pretrained(str(checkpoint), config, dtype=torch.float32)
    result: dict[str, Any] = {
        "family": "pi05",
        "parameters": sum(p.numel() for p in model.core_model.parameters()),
        "action_horizon": config.action_horizon,
        "n_action_steps": config.n_action_steps,
        "state_dim": config.state_dim,
        "action_dim": config.action_dim,
        "output_action_dim": config.output_action_dim,
        "image_keys": list(config.image_keys),
        "max_token_len": config.max_token_len,
    }
    if hf_home is not None:
        from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages import (
            pi05_preprocess,
        )

        preprocessor = pi05_preprocess.Pi05Preprocessor(config)
        task = "pick up the black bowl between the plate and the ramekin and place it on the plate"
        state = torch.linspace(-0.9, 0.9, 8)[None]
        _, mask = preprocessor._tokenize([task], state)
        result["prompt_words"] = len(task.split())
        result["prompt_tokens_state8"] = int(mask.sum())
        _, mask = preprocessor._tokenize([task], torch.nn.functional.pad(state, (0, 24)))
        result["prompt_tokens_state32"] = int(mask.sum())
    return result
