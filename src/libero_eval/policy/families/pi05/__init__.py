"""π0.5 (openpi's LIBERO transforms on the client): the family as one package.

``adapter`` (one class per ``policy.pi05.api``), ``openpi_transforms``, ``checkpoint`` (a
checkpoint's layout), ``paligemma`` (prompts), ``run_config`` (its whole-config parts),
``schema`` (its parts of the config schema, ``schema.yaml``), its part of the reference
server: ``reference_server`` (routes) and ``reference`` (its forms); here: its endpoint, and
its reference server's settings and fingerprint part.

On SGLang 0.5.23: ``Pi05PipelineConfig`` declares no ``keep_resident_min_available_gb`` (its
weights stay resident whatever is free); they load in ``Pi05PolicyModel.from_pretrained``,
which logs "Pi05 weights loaded successfully"; a ``VLA_ACTION`` pipeline runs no synthetic
warm-up; its dynamic batching merges one-observation requests (``--batching-max-size``), and
its denoise CUDA graphs are captured per batch size (:func:`pi05_graph_batches`). Its server
took at most 16 GiB of the GPU serving batches of up to 16 (the true-size openpi lineage with
its graphs captured: 15,372 MiB through the workflow and 14,686 MiB in the bench on one H100,
about 16 GiB on one H200; docs/performance.md), so the env renderers may take all but
``SGLANG_SERVER_GIB`` of it, which leaves room for the 32 graphs
``action_cuda_graph_max_entries`` allows.
"""

from __future__ import annotations

from typing import Any

from libero_eval.policy.endpoint import ConnectionSpec
from libero_eval.policy.families import Family, ReferencePart, statistics_sha256
from libero_eval.policy.families.pi05.adapter import DEFAULTS, Pi05Adapter
from libero_eval.policy.families.pi05.run_config import (
    pi05_graph_batches,
    pi05_settings,
    reference_pi05_model,
)

#: GPU memory its SGLang server may take (GiB): the measured 15-16 and room for more graphs
SGLANG_SERVER_GIB = 24.0

#: policy.pi05.api -> (channel, websocket path, readiness path)
API_ENDPOINTS: dict[str, tuple[str, str, str]] = {
    "sglang_http": ("http", "", "/health"),
    "sglang_websocket": ("websocket", "/openpi/policy", "/health"),
    "openpi_websocket": ("websocket", "", "/healthz"),  # openpi's serve_policy.py
}


def endpoint(url: str, settings: dict[str, Any]) -> ConnectionSpec:
    """``policy.pi05.api`` (see :data:`API_ENDPOINTS`); ``sglang_http`` sends
    ``policy.pi05.wire_format``."""
    block = settings.get("pi05", settings) if isinstance(settings, dict) else None
    if not isinstance(block, dict):
        raise ValueError(f"policy.pi05 must be a mapping, got {type(block).__name__}")
    api = block.get("api", DEFAULTS["api"])
    if api not in API_ENDPOINTS:
        raise ValueError(f"policy.pi05.api must be one of {list(API_ENDPOINTS)}, got {api!r}")
    channel, path, health_path = API_ENDPOINTS[api]
    wire = block.get("wire_format", DEFAULTS["wire_format"])
    return ConnectionSpec(url, channel, wire if channel == "http" else "msgpack", path, health_path)


def reference_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The reference server's π0.5 settings (``reference_server.Settings``): its model, a
    checkpoint or statistics file."""
    return {"norm_stats_path": reference_pi05_model(config)}


def reference_outcome(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": config["server"]["backend"],
        "family": "pi05",
        "policy": config["server"]["reference"]["policy"],
        "stats": statistics_sha256(reference_pi05_model(config)),
    }


FAMILY = Family(
    name="pi05",
    title="π0.5",
    adapter=Pi05Adapter,
    endpoint=endpoint,
    backends=("reference", "sglang", "openpi"),
    example_config="config/libero_pi05_sglang.yaml",
    settings=pi05_settings,
    reference=ReferencePart(
        module="libero_eval.policy.families.pi05.reference_server",
        outcome=reference_outcome,
        settings=reference_settings,
        selftest_checks=(
            "π0.5: the checkpoint (policy.pi05.checkpoint or server.sglang.model_path), its "
            "normalization and lerobot_prompt or discrete_state_input, replan_steps",
        ),
    ),
    statistics_field="policy.pi05",
    graph_batches=pi05_graph_batches,
    sglang_server_gib=SGLANG_SERVER_GIB,
)
