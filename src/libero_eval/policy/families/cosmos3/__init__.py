"""Cosmos3 on SGLang's action API (LIBERO domain): the family as one package.

``adapter`` (requests, answers, statistics, whole-config check), ``actions`` (the action
math), ``schema`` (its parts of the config schema, ``schema.yaml``), its part of the reference
server: ``reference_server`` (routes), ``reference_requests`` / ``reference_responses`` (its
forms), ``sglang_api`` (the facts of SGLang's Cosmos3 API they follow); here: its endpoint,
its older layout, and its reference server's settings and fingerprint part.

On SGLang 0.5.23 (what the serve and rollout sides read of a server's start without naming the
family): Cosmos3 keeps its DiT and VAE resident only with 120 GiB of GPU memory free at its
start (90 for Nano; ``configs/pipeline_configs/cosmos3.py``, ``keep_resident_min_available_gb``),
the line the render budget of ``rollout.total_num_envs: auto`` leaves free
(``rollout.auto.RENDER_GPU_SHARE``); its weights load with one "Loaded <component>" line per
component; its synthetic warm-up runs at SGLang's default 832x480x17 frames unless
:func:`sglang_warmup` gives the run's shape.
"""

from __future__ import annotations

from typing import Any

from libero_eval import package_data, settings_schema
from libero_eval.policy.endpoint import ConnectionSpec
from libero_eval.policy.families import Family, ReferencePart, statistics_sha256
from libero_eval.policy.families.cosmos3.adapter import Cosmos3Adapter
from libero_eval.policy.families.cosmos3.settings import CHOICES, FIELDS

TRANSPORTS = CHOICES["transport"]


def endpoint(url: str, settings: dict[str, Any]) -> ConnectionSpec:
    """SGLang's HTTP action API: ``policy.cosmos3.transport`` msgpack, or png_base64 (JSON)."""
    transport = settings.get("transport", "msgpack") if isinstance(settings, dict) else None
    if transport not in TRANSPORTS:
        raise ValueError(
            f"policy.cosmos3.transport must be one of {list(TRANSPORTS)}, got {transport!r}"
        )
    return ConnectionSpec(url, "http", "msgpack" if transport == "msgpack" else "json")


def upgrade(policy: dict[str, Any]) -> list[str]:
    """Cosmos3 fields written directly under ``policy`` (the layout before issue 21) moved to
    ``policy.cosmos3``; where both are set, the old key (e.g. from an overlay written for the
    old layout) wins. Another family's config with them is refused."""
    old_layout = [key for key in FIELDS if key in policy]
    if not old_layout:
        return []
    family = policy.get("family", settings_schema.default("policy", "family"))
    if family != "cosmos3":
        raise ValueError(
            f"{', '.join('policy.' + key for key in old_layout)}: Cosmos3 setting(s), but "
            f"policy.family is {family}. Remove them; that family's settings go under "
            f"policy.{family}. Are two configs of different families stacked with --configfile?"
        )
    section = policy.get("cosmos3")
    if section is not None and not isinstance(section, dict):
        return []  # the schema reports it
    section = dict(section or {})
    for key in old_layout:
        section[key] = policy.pop(key)
    policy["cosmos3"] = section
    return [
        f"{', '.join('policy.' + key for key in old_layout)}: deprecated layout, read as "
        f"{', '.join('policy.cosmos3.' + key for key in old_layout)}. Cosmos3 settings now "
        "live under policy.cosmos3 (like π0.5's under policy.pi05): move them there (an old "
        "key overrides its policy.cosmos3 twin)"
    ]


def reference_outcome(config: dict[str, Any]) -> dict[str, Any]:
    reference = config["server"]["reference"]
    return {
        "backend": config["server"]["backend"],
        "policy": reference["policy"],
        "normalization": reference["normalization"],
        "stats": statistics_sha256(package_data.resolve(reference["action_stats_path"])),
    }


def sglang_warmup(config: dict[str, Any]) -> tuple[str, ...]:
    """``sglang serve`` arguments that make SGLang's own start-up warm-up request the run's
    shape: ``policy.cosmos3.size`` and ``num_frames``. Without them SGLang 0.5.23 warms the
    model's sampling default, 832x480 with 17 frames
    (``runtime/warmup_request_builder.py`` ``_resolve_default_warmup_resolution``), a shape no
    LIBERO request has; its ``--warmup-resolutions`` and ``--warmup-num-frames``
    (``runtime/server_args/server_args.py``) set the shape, and ``sglang serve`` keeps its
    ``warmup_mode`` "server" (``runtime/entrypoints/cli/serve.py``). Measured on the CPU with
    the tiny random Cosmos3 (tests/fixtures/serve_logs): the warm-up took 22 s at SGLang's
    shape, 5 s at 320x192."""
    cosmos3 = config["policy"]["cosmos3"]
    return (
        "--warmup-resolutions",
        str(cosmos3["size"]),
        "--warmup-num-frames",
        str(cosmos3["num_frames"]),
    )


FAMILY = Family(
    name="cosmos3",
    title="Cosmos3",
    adapter=Cosmos3Adapter,
    endpoint=endpoint,
    backends=("reference", "sglang"),
    example_config="config/config.yaml",
    upgrade=upgrade,
    reference=ReferencePart(
        module="libero_eval.policy.families.cosmos3.reference_server",
        outcome=reference_outcome,
        selftest_checks=(
            "policy.cosmos3.normalization / action_stats_path (quantile_rot needs the "
            "global_raw block)",
            "rot6d layout: the first two COLUMNS of the rotation matrix",
            "policy.cosmos3.gripper_mapping: g = 1 is open (LIBERO -1)",
            "policy.cosmos3.num_action_chunks / num_frames",
        ),
    ),
    statistics_field="policy.cosmos3.action_stats_path",
    sglang_warmup=sglang_warmup,
)
