"""The reference server's settings (:class:`ReferenceServerSettings`) and the facts of SGLang
0.5.23's Cosmos3 action API it serves by: domain names and ids, default raw action dims,
sampling defaults, response formats, and the policy families it can speak for."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from libero_eval import settings_schema
from libero_eval.policy.families.cosmos3.actions import MODEL_ACTION_DIM, stats_block_for

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
# The config's `server.reference` defaults (the schema's): the server's own where it has them.
CONFIG = settings_schema.defaults("server", "reference")
FAMILY = settings_schema.default("policy", "family")


def _setting(default: Any = MISSING, help: str = "", flag: str | None = None, **kw: Any) -> Any:
    """A settings field with its command-line help (and flag, where it is not ``--<name>``)."""
    metadata = {"help": help, **({"flag": flag} if flag else {})}
    if "default_factory" in kw:
        return field(default_factory=kw["default_factory"], metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class ReferenceServerSettings:
    """How the reference server behaves; see ``python -m libero_eval.reference.server -h``.

    The one list of the server's settings: its command-line flags (:func:`add_arguments`,
    :func:`from_arguments`) and the argv the serve job writes (:func:`to_argv`) are derived
    from these fields. The fields of the config's `server.reference` section take their
    defaults from the schema (:data:`CONFIG`), which writes them once (the server runs on its
    own too, so it has defaults); tests/test_settings_defined_once.py checks them."""

    policy: str = _setting(CONFIG["policy"], f"server policy name (default {CONFIG['policy']})")
    action_stats_path: Path = _setting(
        help="Cosmos3 LIBERO action stats JSON", flag="--action-stats"
    )
    normalization: str = _setting(
        CONFIG["normalization"], "quantile_rot (stats block global_raw) or quantile (global)"
    )
    max_batch_size: int = _setting(
        CONFIG["max_batch_size"], "largest batch computed at once, like --batching-max-size"
    )
    padded_action_dim: int = _setting(
        CONFIG["padded_action_dim"],
        f"channels per action row, zero-padded beyond {MODEL_ACTION_DIM}",
    )
    latency_fixed_s: float = _setting(
        CONFIG["latency_fixed_s"], "latency model: fixed seconds per batch"
    )
    latency_per_item_s: float = _setting(
        CONFIG["latency_per_item_s"], "latency model: seconds per observation"
    )
    startup_delay_s: float = _setting(
        CONFIG["startup_delay_s"], "a slow start: /health answers 503 this long (seconds)"
    )
    # None: reference-<policy>, as the serve job names it
    model_name: str | None = _setting(None, "reported model name (default reference-<policy>)")
    # or "pi05": SGLang's π0.5 API (policy/families/pi05/reference.py)
    family: str = _setting(
        FAMILY, f"model family whose SGLang API to serve (default {FAMILY}, policy.family's)"
    )
    # π0.5: the model's own statistics
    norm_stats_path: Path | None = _setting(
        None, "π0.5: the model's statistics file", flag="--norm-stats"
    )
    policy_kwargs: Mapping[str, Any] = _setting(
        help="JSON object of keyword arguments for the policy constructor (default {})",
        default_factory=dict,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "action_stats_path", Path(self.action_stats_path))
        if self.model_name is None:
            object.__setattr__(self, "model_name", f"reference-{self.policy}")
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
        for name in ("latency_fixed_s", "latency_per_item_s", "startup_delay_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 seconds, got {value}")


def flag_of(setting: Field) -> str:
    """A setting's command-line flag: ``--<name with dashes>`` unless it names its own."""
    return setting.metadata.get("flag") or "--" + setting.name.replace("_", "-")


def setting_types() -> dict[str, type]:
    """Each setting's value type (``Path | None`` -> Path, a mapping -> dict)."""
    kinds: dict[str, type] = {}
    for name, hint in get_type_hints(ReferenceServerSettings).items():
        if get_origin(hint) in (Union, UnionType):
            hint = next(arg for arg in get_args(hint) if arg is not type(None))
        kinds[name] = dict if (get_origin(hint) or hint) in (Mapping, dict) else hint
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`ReferenceServerSettings` field, with its default and help."""
    types = setting_types()
    for setting in fields(ReferenceServerSettings):
        kind = types[setting.name]
        kwargs: dict[str, Any] = {"dest": setting.name, "help": setting.metadata["help"]}
        if kind is dict:
            kwargs.update(type=_json_object(flag_of(setting)), default={})
        else:
            kwargs["type"] = kind
            if setting.default is MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = setting.default
        if setting.name == "family":
            kwargs["choices"] = FAMILIES
        parser.add_argument(flag_of(setting), **kwargs)


def _json_object(flag: str) -> Any:
    def parse(text: str) -> dict[str, Any]:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object, got {text!r}")
        return value

    return parse


def from_arguments(args: argparse.Namespace) -> ReferenceServerSettings:
    """The settings from flags parsed by a parser that :func:`add_arguments` filled."""
    return ReferenceServerSettings(
        **{setting.name: getattr(args, setting.name) for setting in fields(ReferenceServerSettings)}
    )


def to_argv(values: Mapping[str, Any]) -> list[str]:
    """The flags for ``values`` (setting name -> value; None or absent: the server's default),
    in field order."""
    argv: list[str] = []
    for setting in fields(ReferenceServerSettings):
        value = values.get(setting.name)
        if value is not None:
            text = json.dumps(value) if isinstance(value, Mapping) else str(value)
            argv += [flag_of(setting), text]
    return argv
