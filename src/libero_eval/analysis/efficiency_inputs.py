"""Reading what a run's efficiency is computed from: the shards' dispatch logs, a slot's
capacity probe (its service file) and what its serve log says while serving (CUDA graphs, the
batches the server merged). Each reader checks its input and names the file and the fix."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# SGLang's VLA CUDA-graph runners log every capture, and once that their capacity is reached
# (SGLang 0.5.23 multimodal_gen/runtime/vla/cuda_graph.py: "Captured VLA %s CUDA graph ...",
# "VLA denoise CUDA graph capacity reached (%d); new signatures run eagerly").
GRAPH_CAPTURED = re.compile(r"Captured VLA \w+ CUDA graph")
GRAPH_CAPACITY_REACHED = re.compile(r"VLA \w+ CUDA graph capacity reached \((\d+)\)")
# SGLang's line for each batch it merged from several requests (0.5.23 runtime/managers/
# scheduler.py: "Processed native grouped batch of %d/%d request(s) ...", "Processed native
# grouped batch sequentially: %d/%d ...", "Processed dynamic batch of %d/%d ..."): requests of
# the batch / its --batching-max-size
SERVER_BATCH = re.compile(
    r"Processed (?:native grouped|dynamic) batch (?:sequentially: |of )(\d+)/(\d+)"
)
# the serve job's line once its server is ready (libero_eval.serve.job)
SERVER_READY = re.compile(r"\[libero_eval\.serve\.job\] slot \d+: ready at ")

DISPATCH_KEYS = (
    "shard",
    "slot",
    "server_url",
    "envs",
    "max_batch_size",
    "max_inflight_requests",
    "started_at",
    "ended_at",
    "requests",
    "env_seconds",
    "reused_episodes",
    "episodes_run",
)


class EfficiencyInputError(ValueError):
    """A dispatch log or a service file's capacity that cannot be read; names the file."""


@dataclass(frozen=True)
class Capacity:
    """A server's capacity probe (the service file's `"capacity"`)."""

    max_batch_size: int
    obs_per_s: float
    probes: pd.DataFrame  # columns observations, requests, seconds: one row per probe

    def latency_fit(self) -> tuple[float, float] | None:
        """(fixed_s, per_observation_s) of seconds = fixed + per_item x observations, least
        squares through the probes; None with fewer than two distinct batch sizes."""
        n = self.probes["observations"].to_numpy(float)
        if len(np.unique(n)) < 2:
            return None
        per_item, fixed = np.polyfit(n, self.probes["seconds"].to_numpy(float), 1)
        return float(fixed), float(per_item)


@dataclass(frozen=True)
class ServeLog:
    """What a server's log says once it was ready: how many CUDA graphs it captured (each
    capture stalls one batch), the graph capacity it reported reaching (None: never, or no
    graphs), and the requests of each batch it merged (empty where it logs none: requests it
    does not merge, the reference server). `graphs` is whether it logs CUDA graphs at all."""

    graphs: bool
    captured_serving: int
    capacity_reached: int | None
    batches: tuple[int, ...]


@dataclass(frozen=True)
class ServiceTimeline:
    """When a slot's server started and was ready (epoch seconds, None where unknown), and
    its start's parts in seconds: the service file's "timeline" and "startup_parts"
    (`libero_eval.serve.job`)."""

    launch: float | None
    ready: float | None
    startup_parts: dict[str, float]


def _service_file(path: Path) -> dict[str, Any]:
    """A slot's service file as a mapping; empty when it is gone (Snakemake removes a service
    output when its group job ends; the serve job may write it again as it stops)."""
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text())
        why = "" if isinstance(info, dict) else f"a JSON {type(info).__name__}, not an object"
    except json.JSONDecodeError as exc:
        why = str(exc)
    if why:
        raise EfficiencyInputError(
            f"{path}: not a service file ({why}); delete it, the serve job rewrites it"
        )
    return info


def _service_info(path: Path, copy: Mapping[str, Any] | None) -> dict[str, Any]:
    """The service file, or where it is gone the shard's copy of it at ready (or {})."""
    return _service_file(path) or dict(copy or {})


def read_service_timeline(
    service_file: Path | str, copy: Mapping[str, Any] | None = None
) -> ServiceTimeline | None:
    """The server's timeline from a slot's service file, or where the file is gone from
    `copy` (its shard's dispatch log's "server", the file as it was at ready); None without
    either, or from an older serve job (no "timeline")."""
    path = Path(service_file)
    info = _service_info(path, copy)
    timeline = info.get("timeline")
    if timeline is None:
        return None
    try:
        parts = {str(k): float(v) for k, v in (info.get("startup_parts") or {}).items()}
        launch, ready = (
            None if timeline.get(key) is None else float(timeline[key])
            for key in ("launch", "ready")
        )
    except (AttributeError, TypeError, ValueError) as exc:
        raise EfficiencyInputError(
            f"{path}: its timeline needs epoch seconds and its startup_parts seconds "
            f"({exc!r}); delete the file, the serve job rewrites it"
        ) from None
    return ServiceTimeline(launch, ready, parts)


def read_dispatch_log(path: Path | str) -> dict[str, Any]:
    """One shard's dispatch log, checked: every key present, `requests` well formed."""
    path = Path(path)
    try:
        log = json.loads(path.read_text())
    except FileNotFoundError:
        raise EfficiencyInputError(
            f"{path}: no dispatch log; the rollout job writes it at the end of the shard, "
            "rerun the workflow to produce it"
        ) from None
    except json.JSONDecodeError as exc:
        raise EfficiencyInputError(
            f"{path}: not JSON ({exc}); delete it and rerun the workflow to rewrite it"
        ) from None
    missing = [k for k in DISPATCH_KEYS if not isinstance(log, dict) or k not in log]
    if missing:
        raise EfficiencyInputError(
            f"{path}: dispatch log lacks {missing}; it was written by an older runner, "
            "delete it and rerun the workflow to rewrite it"
        )
    for i, entry in enumerate(log["requests"]):
        if not (isinstance(entry, list | tuple) and len(entry) in (4, 5, 6)):
            raise EfficiencyInputError(
                f"{path}: requests[{i}] is {entry!r}, expected "
                "[sent_at, answered_at, observations, ok, batch, left_at]; delete it and "
                "rerun the workflow"
            )
        if entry[1] < entry[0]:
            raise EfficiencyInputError(
                f"{path}: requests[{i}] was answered before it was sent ({entry!r}); "
                "delete it and rerun the workflow"
            )
    if not {"waiting", "stepping"} <= set(log["env_seconds"]):
        raise EfficiencyInputError(
            f"{path}: env_seconds needs 'waiting' and 'stepping', got {log['env_seconds']!r}; "
            "delete it and rerun the workflow"
        )
    return log


def read_capacity(
    service_file: Path | str, copy: Mapping[str, Any] | None = None
) -> Capacity | None:
    """The capacity probe of a slot's service file, or where the file is gone of `copy` (as
    `read_service_timeline`); None when neither has a `capacity` (older runs, a failed
    probe)."""
    path = Path(service_file)
    capacity = _service_info(path, copy).get("capacity")
    if capacity is None:
        return None
    try:
        probes = pd.DataFrame(capacity["probes"], columns=["observations", "requests", "seconds"])
        result = Capacity(int(capacity["max_batch_size"]), float(capacity["obs_per_s"]), probes)
    except (KeyError, TypeError, ValueError) as exc:
        raise EfficiencyInputError(
            f"{path}: its capacity needs max_batch_size, probes (observations, requests, "
            f"seconds) and obs_per_s ({exc!r}); delete the file, the serve job rewrites it"
        ) from None
    if probes.isna().any().any() or (probes["seconds"] <= 0).any():
        raise EfficiencyInputError(
            f"{path}: a capacity probe lacks a field or took no time: "
            f"{capacity['probes']!r}; delete the file, the serve job rewrites it"
        )
    return result


def read_serve_log(serve_log: Path | str) -> ServeLog | None:
    """The CUDA-graph and batch lines of a slot's serve log; None without the log, or for a
    server that logs neither (the reference server, a pipeline without VLA graphs that does
    not merge requests). The warm-up's and the capacity probe's batches are not counted: they
    run before the serve job's "ready" line."""
    path = Path(serve_log)
    if not path.is_file():
        return None
    any_graph, serving, captured, reached = False, False, 0, None
    batches: list[int] = []
    for line in path.read_text(errors="replace").splitlines():
        if SERVER_READY.search(line):
            serving = True
        elif match := SERVER_BATCH.search(line):
            if serving:
                batches.append(int(match.group(1)))
        elif GRAPH_CAPTURED.search(line):
            any_graph = True
            captured += serving
        elif match := GRAPH_CAPACITY_REACHED.search(line):
            any_graph, reached = True, int(match.group(1))
    if not any_graph and not batches:
        return None
    return ServeLog(any_graph, captured, reached, tuple(batches))
