"""π0.5's whole-config parts: the server that speaks ``policy.pi05.api`` and what it needs,
the checkpoint that decides the request layout, and what the reference server loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from libero_eval import package_data

PI05_PIPELINE_CLASS = "Pi05Pipeline"


def check_pi05_run_config(config: dict[str, Any]) -> None:
    """A server backend that speaks ``policy.pi05.api``, with what it needs set."""
    server = config["server"]
    api = config["policy"]["pi05"]["api"]
    backend = server["backend"]
    if backend == "openpi":
        if api != "openpi_websocket":
            raise ValueError(
                f"server.backend openpi speaks openpi's websocket protocol; policy.pi05.api is "
                f"{api}: set it to openpi_websocket"
            )
        if not server["openpi"]["command"]:
            raise ValueError(
                "server.openpi.command is not set: give openpi's server command line, e.g. "
                '["uv", "run", "scripts/serve_policy.py", "--env", "LIBERO"], and '
                "server.openpi.cwd (the openpi checkout)"
            )
    elif backend == "sglang":
        if api == "openpi_websocket":
            raise ValueError(
                "policy.pi05.api openpi_websocket talks to openpi's own server; with "
                "server.backend sglang use sglang_http or sglang_websocket (SGLang's "
                "/openpi/policy)"
            )
        sglang = server["sglang"]
        if sglang["pipeline_class_name"] != PI05_PIPELINE_CLASS:
            raise ValueError(
                f"server.sglang.pipeline_class_name is {sglang['pipeline_class_name']!r}; "
                f"π0.5 is served by SGLang's {PI05_PIPELINE_CLASS}: set it"
            )
        if not sglang["model_path"]:
            raise ValueError(
                "server.sglang.model_path is not set: point it at the local π0.5 checkpoint "
                "directory (its config.json decides the cameras, state width and chunk size)"
            )
    else:
        stats = package_data.resolve(server["reference"]["norm_stats_path"])
        if not stats.exists():
            raise ValueError(
                f"server.reference.norm_stats_path: {stats} does not exist; point it at the "
                "model's own π0.5 statistics, e.g. libero_eval:stats/pi05_libero_norm_stats.json"
            )


def pi05_checkpoint(config: dict[str, Any]) -> str | None:
    """The π0.5 checkpoint that decides the request layout: ``policy.pi05.checkpoint``, else
    the SGLang server's model (``server.sglang.model_path``), also when the self-test swaps in
    the reference server; None for openpi's own server, or when neither is set."""
    policy = config["policy"]
    pi05 = policy.get("pi05") or {}
    if policy.get("family") != "pi05" or pi05.get("api") == "openpi_websocket":
        return None
    if pi05.get("checkpoint") is not None:
        return pi05["checkpoint"]
    server = config.get("server") or {}
    if server.get("backend") not in ("sglang", "reference"):
        return None
    return (server.get("sglang") or {}).get("model_path")


def pi05_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``policy.pi05`` as the adapter takes it, ``checkpoint`` resolved
    (:func:`pi05_checkpoint`)."""
    settings = dict(config["policy"]["pi05"])
    checkpoint = pi05_checkpoint(config)
    if checkpoint is not None:
        settings["checkpoint"] = checkpoint
    return settings


def reference_pi05_model(config: dict[str, Any]) -> str:
    """What the reference server loads as its π0.5 model: the checkpoint directory (its layout
    and its own statistics) where there is one, else ``server.reference.norm_stats_path``."""
    checkpoint = pi05_checkpoint(config)
    if checkpoint is not None and (Path(checkpoint) / "config.json").is_file():
        return str(checkpoint)
    return str(package_data.resolve(config["server"]["reference"]["norm_stats_path"]))
