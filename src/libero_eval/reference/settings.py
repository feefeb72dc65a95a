"""The reference server's settings (:class:`ReferenceServerSettings`) and the facts of SGLang
0.5.23's Cosmos3 action API it serves by: domain names and ids, default raw action dims,
sampling defaults, response formats, and the policy families it can speak for."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libero_eval.policy.actions import MODEL_ACTION_DIM, stats_block_for

ACTION_HORIZON = 16
LIBERO_DOMAIN_NAME = "libero"
# SGLang 0.5.23 pipelines_core/stages/model_specific_stages/cosmos3_action.py.
EMBODIMENT_TO_DOMAIN_ID: dict[str, int] = {
    "no_action": 0,
    "av": 1,
    "camera_pose": 2,
    "hand_pose": 3,
    "pusht": 4,
    "libero": 5,
    "umi": 6,
    "bridge_orig_lerobot": 7,
    "droid_lerobot": 8,
    "robomind-franka": 8,
    "galbot": 9,
    "robomind-franka-dual": 12,
    "robomind-ur": 13,
    "agibotworld": 15,
    "agibot_gear_gripper": 15,
    "agibot_gear_gripper_ext": 15,
    "fractal": 20,
}
EMBODIMENT_TO_RAW_ACTION_DIM: dict[str, int] = {
    "av": 9,
    "camera_pose": 9,
    "pusht": 2,
    "umi": 10,
    "bridge_orig_lerobot": 10,
    "droid_lerobot": 10,
    "robomind-franka": 10,
    "robomind-franka-dual": 20,
    "robomind-ur": 10,
    "agibotworld": 29,
    "fractal": 10,
}
LIBERO_DOMAIN_ID = EMBODIMENT_TO_DOMAIN_ID[LIBERO_DOMAIN_NAME]
# SGLang 0.5.23 configs/sample/cosmos3.py, Cosmos3SamplingParams defaults.
SUPPORTED_RESOLUTIONS = [[1280, 720], [720, 1280], [832, 480], [480, 832], [1024, 1024], [640, 640]]
DEFAULT_NUM_INFERENCE_STEPS = 35
DEFAULT_SEED = 42
RESPONSE_FORMATS = ("envelope", "raw")
FAMILIES = ("cosmos3", "pi05")


@dataclass(frozen=True, kw_only=True)
class ReferenceServerSettings:
    """How the reference server behaves; see ``python -m libero_eval.reference.server -h``."""

    action_stats_path: Path
    policy: str = "hold"
    policy_kwargs: Mapping[str, Any] = field(default_factory=dict)
    normalization: str = "quantile_rot"
    max_batch_size: int = 8
    padded_action_dim: int = MODEL_ACTION_DIM
    latency_fixed_s: float = 0.0
    latency_per_item_s: float = 0.0
    model_name: str = "reference-hold"
    family: str = "cosmos3"  # or "pi05": SGLang's π0.5 API (reference/pi05.py)
    norm_stats_path: Path | None = None  # π0.5: the model's own statistics

    def __post_init__(self) -> None:
        object.__setattr__(self, "action_stats_path", Path(self.action_stats_path))
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {list(FAMILIES)}, got {self.family!r}")
        if self.family == "pi05" and self.norm_stats_path is None:
            raise ValueError("family pi05 needs norm_stats_path (the model's own statistics)")
        stats_block_for(self.normalization)  # raises for unknown names
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.padded_action_dim < MODEL_ACTION_DIM:
            raise ValueError(
                f"padded_action_dim must be >= {MODEL_ACTION_DIM} (the LIBERO model action has "
                f"{MODEL_ACTION_DIM} channels), got {self.padded_action_dim}"
            )
        for name in ("latency_fixed_s", "latency_per_item_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 seconds, got {value}")
