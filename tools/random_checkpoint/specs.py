"""Configuration files of the random checkpoints (pure Python: no torch, no SGLang).

Everything here is what a checkpoint directory says about itself: Cosmos3's diffusers
``model_index.json`` and component configs, and π0.5's ``config.json`` in the two lineages
SGLang 0.5.23 serves (LeRobot, and openpi converted to PyTorch), taken from the project's
layout specimens (``pi05_layouts``) with the size's model variants.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SIZES = ("true", "tiny")
PI05_LINEAGES = ("lerobot", "openpi")
PALIGEMMA_REPO = "google/paligemma-3b-pt-224"
SEED = 1234  # the weights' generator seed unless --seed gives another

# --- Cosmos3 (Cosmos3OmniDiffusersPipeline) ------------------------------------------------

COSMOS3_MODEL_INDEX: dict[str, Any] = {
    "_class_name": "Cosmos3OmniDiffusersPipeline",
    "_diffusers_version": "0.36.0",
    "scheduler": ["diffusers", "FlowUniPCMultistepScheduler"],
    "text_tokenizer": ["transformers", "Qwen2TokenizerFast"],
    "transformer": ["diffusers", "Cosmos3OmniTransformer"],
    "vae": ["diffusers", "AutoencoderKLWan"],
}

COSMOS3_SCHEDULER: dict[str, Any] = {
    "_class_name": "FlowUniPCMultistepScheduler",
    "_diffusers_version": "0.36.0",
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": False,
}

# The true DiT is SGLang 0.5.23's default Cosmos3 architecture (Cosmos3VideoArchConfig,
# Qwen3-8B-derived): 4096 x 36, GQA 32/8, FFN 12288, 14.55 B parameters.
_COSMOS3_TRANSFORMER: dict[str, Any] = {
    "_class_name": "Cosmos3OmniTransformer",
    "_diffusers_version": "0.36.0",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "hidden_act": "silu",
    "qk_norm_for_text": True,
    "use_und_k_norm_for_gen": False,
    "latent_patch_size": 2,
    "latent_channel": 48,
    "out_channels": 48,
    "rope_theta": 5000000.0,
    "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20]},
    "base_fps": 24.0,
    "temporal_compression_factor": 4,
    "unified_3d_mrope_temporal_modality_margin": 15000,
    "sound_gen": False,
    "action_gen": True,
    "action_dim": 64,
    "num_embodiment_domains": 32,
    "timestep_scale": 0.001,
    "frequency_embedding_size": 256,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-06,
}

# Wan 2.2-like VAE with 48 latent channels (16x spatial, 4x temporal compression).
_WAN_LATENTS_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542,
    0.2813, 0.0891, 0.157, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,
    0.2665, -0.2108, -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899,
    -0.2799, -0.123, -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.052, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]  # fmt: skip
_WAN_LATENTS_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.499, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894,
    1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146,
    0.8986, 0.5659, 0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709,
    0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.06, 0.3894, 0.5452,
    0.2898, 0.5061, 0.3937, 0.5201,
]  # fmt: skip
_COSMOS3_VAE: dict[str, Any] = {
    "_class_name": "AutoencoderKLWan",
    "_diffusers_version": "0.35.0",
    "attn_scales": [],
    "base_dim": 160,
    "decoder_base_dim": 256,
    "clip_output": False,
    "dim_mult": [1, 2, 4, 4],
    "dropout": 0.0,
    "in_channels": 12,
    "out_channels": 12,
    "is_residual": True,
    "latents_mean": _WAN_LATENTS_MEAN,
    "latents_std": _WAN_LATENTS_STD,
    "num_res_blocks": 2,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    "temperal_downsample": [False, True, True],
    "z_dim": 48,
}

# "tiny": the same classes and wiring, small enough for a CPU forward in seconds. The latent
# width (48), patching, compression factors, vocabulary and action head stay as they are, so
# requests, tokenizer and responses are those of the true model.
_COSMOS3_TINY_TRANSFORMER = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "rope_scaling": {"rope_type": "default", "mrope_section": [12, 10, 10]},
}
_COSMOS3_TINY_VAE = {"base_dim": 16, "decoder_base_dim": 16, "num_res_blocks": 1}


def cosmos3_configs(size: str) -> dict[str, dict[str, Any]]:
    """``{relative path: JSON}`` of a Cosmos3 checkpoint's configuration files."""
    _check_size(size)
    transformer = dict(_COSMOS3_TRANSFORMER)
    vae = dict(_COSMOS3_VAE)
    if size == "tiny":
        transformer.update(_COSMOS3_TINY_TRANSFORMER)
        vae.update(_COSMOS3_TINY_VAE)
    return {
        "model_index.json": COSMOS3_MODEL_INDEX,
        "transformer/config.json": transformer,
        "vae/config.json": vae,
        "scheduler/scheduler_config.json": COSMOS3_SCHEDULER,
    }


# --- π0.5 (Pi05Pipeline) ------------------------------------------------------------------

# SGLang 0.5.23 knows two Gemma variants (pi05_core.get_gemma_variant_config). "tiny" names
# variants of its own, which only a loader patched by
# tools/random_checkpoint/sglang_models.py (pi05_tiny_variants) knows: an unpatched SGLang
# refuses them ("Unknown Pi05 Gemma variant"), so a tiny π0.5 is for loader tests, not serving.
PI05_TINY_VARIANTS: dict[str, dict[str, int]] = {
    # the VLM's width stays 2048: SGLang fixes the SigLIP projector's output at 2048
    "random_tiny_vlm": dict(
        width=2048, depth=1, mlp_dim=256, num_heads=8, num_kv_heads=1, head_dim=256
    ),
    # joint attention: heads, head_dim and depth match the VLM's
    "random_tiny_expert": dict(
        width=256, depth=1, mlp_dim=512, num_heads=8, num_kv_heads=1, head_dim=256
    ),
}
PI05_TINY_VOCAB = 1024  # ids of the stand-in tokenizer stay far below this
PI05_TINY_VISION_LAYERS = 1


def _variants(size: str) -> tuple[str, str]:
    return ("gemma_2b", "gemma_300m") if size == "true" else tuple(PI05_TINY_VARIANTS)


def _layouts():
    """The project's π0.5 layout specimens (``pi05_layouts`` beside this module: pure Python
    and numpy)."""
    from . import pi05_layouts

    return pi05_layouts


def pi05_config(
    lineage: str, size: str = "true", normalization: str = "QUANTILES"
) -> dict[str, Any]:
    """π0.5 ``config.json`` as each lineage writes it for LIBERO (the project's specimens,
    ``docs/pi05.md``), with the model variants of ``size``.

    - ``lerobot``: LeRobot's ``PI05Config`` (``type: pi05``), LIBERO features
      ``observation.images.image`` (agentview), ``observation.images.image2`` (wrist),
      ``observation.state`` [8], action [7]; chunk 50; ``normalization`` QUANTILES (π0.5's
      own) or MEAN_STD (``pi05_libero_finetuned_v044``, config/libero_pi05_sglang.yaml).
    - ``openpi``: what openpi's ``examples/convert_jax_model_to_pytorch.py`` writes for
      ``pi05_libero`` (``action_dim``, ``action_horizon`` 10, the variants, ``precision``),
      plus ``chunk_size`` 10, which SGLang reads for the horizon and the converter does not
      write.
    """
    _check_size(size)
    if lineage not in PI05_LINEAGES:
        raise ValueError(f"unknown π0.5 lineage {lineage!r}; known: {PI05_LINEAGES}")
    layouts = _layouts()
    if lineage == "openpi":
        config = layouts.openpi_config()
    else:
        config = layouts.lerobot_config(normalization=normalization)
    config["paligemma_variant"], config["action_expert_variant"] = _variants(size)
    return config


def write_pi05_configs(
    directory: Path,
    lineage: str,
    size: str = "true",
    norm_stats: Path | None = None,
    normalization: str = "QUANTILES",
) -> list[Path]:
    """Write a π0.5 checkpoint's configuration (no weights) into ``directory``: the project's
    layout specimen of the lineage (``config.json``; LeRobot's ``policy_preprocessor.json``
    and normalizer safetensors, or openpi's ``assets/physical-intelligence/libero/``), with
    the statistics of ``norm_stats`` (an openpi ``norm_stats.json``; default the project's
    test statistics) and the variants of ``size``. Returns the paths written."""
    layouts = _layouts()
    write = layouts.write_openpi if lineage == "openpi" else layouts.write_lerobot
    if lineage not in PI05_LINEAGES:
        raise ValueError(f"unknown π0.5 lineage {lineage!r}; known: {PI05_LINEAGES}")
    options = {"stats": norm_stats} if norm_stats else {}
    if lineage == "lerobot":
        options["normalization"] = normalization
    write(directory, **options)
    _write_json(directory / "config.json", pi05_config(lineage, size, normalization))
    return sorted(p for p in directory.rglob("*") if p.is_file())


def write_cosmos3_configs(directory: Path, size: str) -> list[Path]:
    """Write a Cosmos3 checkpoint's configuration files (no weights, no tokenizer)."""
    written = []
    for relative, payload in cosmos3_configs(size).items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        written.append(_write_json(path, payload))
    return written


def _write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {SIZES}")
