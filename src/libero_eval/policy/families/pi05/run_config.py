"""π0.5's whole-config check: the server that speaks ``policy.pi05.api`` and what it needs."""

from __future__ import annotations

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
