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
        check_pipeline_config(sglang.get("pipeline_config") or {}, sglang["model_path"])
    else:
        stats = package_data.resolve(server["reference"]["norm_stats_path"])
        if not stats.exists():
            raise ValueError(
                f"server.reference.norm_stats_path: {stats} does not exist; point it at the "
                "model's own π0.5 statistics, e.g. libero_eval:stats/pi05_libero_norm_stats.json"
            )


def check_pipeline_config(fields: dict[str, Any], model_path: str) -> None:
    """``server.sglang.pipeline_config``'s CUDA-graph fields as SGLang 0.5.23's
    ``Pi05PipelineConfig._validate_cuda_graph_config`` takes them (it would refuse them only
    once the server starts): buckets positive, strictly increasing and within the checkpoint's
    ``max_token_len``; graph capacities non-negative integers."""
    where = "server.sglang.pipeline_config"
    buckets = fields.get("prompt_token_buckets", [])
    if not isinstance(buckets, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in buckets
    ):
        raise ValueError(
            f"{where}.prompt_token_buckets: expected a list of positive token counts, e.g. "
            f"[32, 64, 128, 200], got {buckets!r}"
        )
    if sorted(set(buckets)) != buckets:
        raise ValueError(
            f"{where}.prompt_token_buckets: must be strictly increasing, got {buckets!r}"
        )
    for key in ("action_cuda_graph_max_entries", "prefix_cuda_graph_max_entries"):
        value = fields.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}.{key}: expected an integer >= 0, got {value!r}")
    if buckets and (Path(model_path) / "config.json").is_file():
        from libero_eval.policy.families.pi05.checkpoint import read_checkpoint

        limit = read_checkpoint(model_path).max_token_len
        if buckets[-1] > limit:
            raise ValueError(
                f"{where}.prompt_token_buckets: {buckets[-1]} exceeds the checkpoint's "
                f"max_token_len {limit} ({model_path}/config.json); SGLang refuses it at "
                f"start. End the buckets at {limit} or below"
            )


def pi05_graph_batches(config: dict[str, Any]) -> tuple[int, ...]:
    """The merged batch sizes whose CUDA graphs a π0.5 run on SGLang uses and SGLang keeps,
    to be captured before the server is ready (`libero_eval.policy.capacity.warm_graphs`),
    with ``server.capture_graphs_before_ready``: 1 to ``batching_max_size`` where
    ``pipeline_config.prompt_token_buckets`` pads the prompts and
    ``action_cuda_graph_max_entries`` holds that many graphs; () otherwise.

    SGLang 0.5.23 keys a denoising graph by batch size and prefix length
    (``runtime/vla/cuda_graph.py`` ``VLADenoiseGraphSignature``, built in
    ``runtime/models/vlas/pi05_policy.py`` ``denoise_step``); the prefix length is the images'
    tokens plus the prompt's, padded to its bucket with buckets (``encode_prefix``,
    ``runtime/vla/prompt_bucketing.py``), else exact. With exact lengths the probe's prompt
    would key graphs no run's prompt shares and take their places (SGLang keeps 4 by default:
    ``Pi05PipelineConfig.action_cuda_graph_max_entries``)."""
    server = config["server"]
    if server["backend"] != "sglang":
        return ()
    sglang = server["sglang"]
    fields = sglang.get("pipeline_config") or {}
    size = int(sglang["batching_max_size"])
    if (
        not server["capture_graphs_before_ready"]
        or not fields.get("prompt_token_buckets")
        or fields.get("enable_action_cuda_graph", True) is False
        or int(fields.get("action_cuda_graph_max_entries", 4)) < size
    ):
        return ()
    return tuple(range(1, size + 1))


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
