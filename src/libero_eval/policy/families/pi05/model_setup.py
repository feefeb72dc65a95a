"""What a π0.5 checkpoint decides for the client before its first request, each configured
value checked against it: the state's width, the statistics to normalize with, the tokenizer of
a prompt built on the client (``checkpoint.py`` reads the checkpoint as SGLang does;
``docs/pi05.md`` cites every value). The adapter (``adapter.py``) then applies them to each
observation."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libero_eval.policy.families.pi05.openpi_transforms as T
import libero_eval.policy.families.pi05.paligemma as paligemma
from libero_eval.policy.families.pi05.checkpoint import Pi05Layout
from libero_eval.policy.families.pi05.settings import agree, same_path


def state_width(layout: Pi05Layout, pad: Any) -> int:
    """LeRobot: the STATE feature's width (8), which LeRobot >= 0.5 discretizes unpadded;
    openpi: PadStatesAndActions to the model's 32; no checkpoint: SGLang's default 32."""
    configured = T.LIBERO_STATE_DIM if pad is None else pad
    if layout.lineage == "sglang_default":
        width = layout.state_dim if pad == "checkpoint" else configured
    else:
        asked = None if pad == "checkpoint" else configured
        width = agree("pad_state_to", asked, layout.state_dim, layout)
    if width < T.LIBERO_STATE_DIM:
        raise ValueError(
            f"the checkpoint's state width is {width}, narrower than LIBERO's "
            f"{T.LIBERO_STATE_DIM}-D state ({layout.describe()})"
        )
    if width > layout.state_dim:
        raise ValueError(
            f"policy.pi05.pad_state_to {width} is wider than the model's state "
            f"dim {layout.state_dim}: SGLang refuses it (Pi05 state dim must be <= "
            f"{layout.state_dim})"
        )
    return width


def load_stats(layout: Pi05Layout, stats_path: Any, normalization: str) -> tuple[T.NormStats, str]:
    """The checkpoint's statistics (``policy.pi05.norm_stats_path`` where it has none) and
    their file's sha256."""
    if stats_path is not None and not Path(stats_path).exists():
        try:
            T.load_norm_stats(stats_path)  # says what is missing and what to give
        except (OSError, ValueError) as exc:
            raise ValueError(f"policy.pi05.norm_stats_path: {exc}") from exc
    if layout.stats_path is not None:
        if stats_path is not None and not same_path(stats_path, layout.stats_path):
            raise ValueError(
                f"policy.pi05.norm_stats_path is {stats_path} but the checkpoint carries its "
                f"own statistics ({layout.stats_path}): remove policy.pi05.norm_stats_path"
            )
        stats_path = layout.stats_path
    elif stats_path is None:
        where = (
            f"the checkpoint {layout.source} carries none (LeRobot: "
            "policy_preprocessor.json and its normalizer safetensors; openpi: "
            "assets/<asset_id>/norm_stats.json, which openpi's converter does not copy: "
            "docs/pi05.md)"
            if layout.source is not None
            else "there is no checkpoint (policy.pi05.checkpoint, server.sglang.model_path)"
        )
        raise ValueError(
            f"policy.pi05.norm_stats_path: no statistics to normalize with: {where}. Set "
            "policy.pi05.norm_stats_path to the model's own (openpi's "
            "assets/<asset_id>/norm_stats.json, a LeRobot normalizer *.safetensors or "
            "stats.json); against the CPU reference server, its made-up test file "
            "libero_eval:stats/pi05_libero_norm_stats.json"
        )
    try:
        stats = T.load_norm_stats(stats_path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"policy.pi05.norm_stats_path: {exc}") from exc
    try:
        T.check_stats(stats, normalization, T.LIBERO_STATE_DIM, T.LIBERO_ACTION_DIM)
    except ValueError as exc:
        raise ValueError(f"policy.pi05.norm_stats_path: {exc}") from exc
    return stats, hashlib.sha256(stats.source.read_bytes()).hexdigest()


@dataclass(frozen=True)
class PromptTokenizer:
    """The tokenizer of a prompt built on the client: openpi's SentencePiece model
    (``model``, with ``discrete_state_input``) or LeRobot <= 0.4.4's tokenizer.json
    (``json``); neither where SGLang builds the prompt."""

    model: Path | None = None
    json: Path | None = None
    discrete_state_input: bool | None = None


def find_tokenizer(layout: Pi05Layout, s: dict[str, Any]) -> PromptTokenizer:
    """The tokenizer of the client-side prompt, where the lineage's training pipeline
    differs from SGLang's prompt (openpi; LeRobot <= 0.4.4)."""
    model = json = discrete_state_input = None
    if layout.lineage == "openpi":
        if s["discrete_state_input"] is None:
            raise ValueError(
                "policy.pi05.discrete_state_input must be set for an openpi-trained "
                "checkpoint: its config.json does not record it. openpi's pi05_libero has "
                "discrete_state_input=False (src/openpi/training/config.py, pi05_libero)"
            )
        discrete_state_input = s["discrete_state_input"]
        model = paligemma.find_model(s["tokenizer_path"], layout.source)
    elif s["discrete_state_input"] is not None:
        raise ValueError(
            "policy.pi05.discrete_state_input is for openpi-trained checkpoints; this one is "
            f"{layout.describe()}"
        )
    if layout.lineage == "lerobot" and s["lerobot_prompt"] == "padded":
        json = paligemma.find_model(s["tokenizer_path"], layout.source, "json")
    elif s["lerobot_prompt"] == "padded":
        raise ValueError(
            "policy.pi05.lerobot_prompt padded is for checkpoints trained with LeRobot <= "
            f"0.4.4; this one is {layout.describe()}"
        )
    if s["tokenizer_path"] is not None and not (model or json):
        raise ValueError(
            f"policy.pi05.tokenizer_path is set but this checkpoint ({layout.describe()}) "
            "gets the prompt SGLang builds: remove it"
        )
    return PromptTokenizer(model, json, discrete_state_input)
