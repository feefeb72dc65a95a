"""A slot's server, from the checked config: the GPUs it is pinned to, its port, its settings
for the serve job (`ServerSettings`, JSON on the serve rule's command line), whether it runs on
a GPU, and the part of it that changes actions (in the rollout fingerprint). The config's
policy family is registered first (`config.RunSettings`, `config.check_config`).

With `server.backend: url` a slot's server is one the user already runs: `slot_urls` reads
its URL from `server.url.urls` (a list, one per slot; or, for a run of several checkpoints,
a mapping of checkpoint names to such lists, read with the checkpoint's name)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from libero_eval import settings_schema
from libero_eval.policy import families
from libero_eval.policy.families import Family
from libero_eval.serve.settings import ServerSettings
from libero_eval.service import is_loopback

# Backends whose server is a GPU process run by a command of its own (not the reference).
GPU_BACKENDS = ("sglang", "openpi")
URLS_FIELD = "server.url.urls"


def _family(config: dict[str, Any]) -> Family:
    return families.get(config["policy"]["family"])


def family_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``policy.<family>``, the settings the family's adapter takes, with what the whole config
    decides of them resolved (``Family.settings``)."""
    family = _family(config)
    if family.settings is not None:
        return family.settings(config)
    return dict(config["policy"][family.name])


def slot_urls(config: dict[str, Any], checkpoint: str | None = None) -> list[tuple[str, str]]:
    """``(field, url)`` of each slot's server with ``server.backend: url``, in slot order:
    ``server.url.urls`` as a list, or its entry for ``checkpoint`` where it maps checkpoint
    names to lists. A trailing ``/`` is dropped (the endpoint's paths are appended).
    ``ValueError`` names the field: a mapping without a checkpoint, an unknown checkpoint."""
    urls = config["server"]["url"]["urls"]
    field = URLS_FIELD
    if isinstance(urls, dict):
        if checkpoint is None:
            raise ValueError(
                f"{URLS_FIELD}: a mapping of checkpoint names to URLs is for a run of several "
                "checkpoints (checkpoints:); this run evaluates one: give a list, one URL per "
                "slot"
            )
        if checkpoint not in urls:
            raise ValueError(
                f"{URLS_FIELD}: no URLs for checkpoint {checkpoint!r} (it lists "
                f"{sorted(urls)}): add its servers under its name"
            )
        urls, field = urls[checkpoint], f"{URLS_FIELD}.{checkpoint}"
    return [(f"{field}[{k}]", str(url).rstrip("/")) for k, url in enumerate(urls)]


def url_backend_warnings(config: dict[str, Any]) -> list[str]:
    """What a run against servers the user runs says once, in the workflow's log: a URL on
    another host (the run's observations cross the network to it, through the environment's
    proxy settings), and a fingerprint that cannot know the servers' weights (no
    ``server.url.model_id``)."""
    server = config["server"]
    if server["backend"] != "url":
        return []
    urls = server["url"]["urls"]
    named = (
        [(f"{URLS_FIELD}.{c}[{k}]", u) for c, us in urls.items() for k, u in enumerate(us)]
        if isinstance(urls, dict)
        else slot_urls(config)
    )
    said = []
    for field, url in named:
        host = urlsplit(url).hostname
        if not is_loopback(host):
            said.append(
                f"{field} {url} is on another host ({host}): the run's observations go to it "
                "over the network, to a server that has no authentication, and the "
                "environment's proxy settings (HTTP_PROXY, HTTPS_PROXY, NO_PROXY) apply to it "
                "(a loopback URL is reached directly). Your choice; said once"
            )
    if server["url"]["model_id"] is None:
        said.append(
            "server.url.model_id is not set: the episode store is named by the servers' URLs, "
            "not by their weights, which the workflow cannot see. Weights changed behind the "
            "same URL would reuse episodes of the old ones: set server.url.model_id to name "
            "the weights (and change it when they change; docs/servers.md)"
        )
    return said


def server_policy_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The server-side settings that change actions (part of the rollout fingerprint). A
    server the user runs (backend url) is named by ``server.url.model_id`` where it is given,
    else by its URLs: the workflow cannot hash weights it does not load."""
    server = config["server"]
    if server["backend"] == "url":
        model_id = server["url"]["model_id"]
        if model_id is not None:
            return {"backend": "url", "model_id": model_id}
        return {"backend": "url", "urls": server["url"]["urls"]}
    if server["backend"] == "reference":
        part = _family(config).reference
        assert part is not None, "check_config refuses a family the reference cannot serve"
        return part.outcome(config)
    if server["backend"] == "family":
        family = _family(config)
        assert family.server is not None
        return {"backend": "family", "family": family.name, "command": list(family.server.command)}
    if server["backend"] == "openpi":
        openpi = server["openpi"]
        return {"backend": "openpi", "command": openpi["command"], "cwd": openpi["cwd"]}
    sglang = server["sglang"]
    model_path = sglang["model_path"]
    part = {
        "backend": "sglang",
        "model_path": str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
        "pipeline_class_name": sglang["pipeline_class_name"],
    }
    if sglang.get("pipeline_config"):  # e.g. prompt buckets change the model's input shapes
        part["pipeline_config"] = sglang["pipeline_config"]
    return part


def server_on_gpu(config: dict[str, Any]) -> bool:
    """Whether a slot's server runs on a GPU: :data:`GPU_BACKENDS`, or a family's own server
    that says so (``FamilyServer.gpu``)."""
    backend = config["server"]["backend"]
    if backend == "family":
        own = _family(config).server
        return own is not None and own.gpu
    return backend in GPU_BACKENDS


def gpus_per_slot(config: dict[str, Any]) -> int:
    """GPUs a slot's server is pinned to: SGLang's num_gpus, none for a server the user runs
    (backend url: it uses no GPU of the workflow's), else one."""
    server = config["server"]
    return {"sglang": server["sglang"]["num_gpus"], "url": 0}.get(server["backend"], 1)


def slot_gpu_ids(config: dict[str, Any], slot: int) -> int | list[int] | None:
    """The GPU(s) slot `slot`'s server is pinned to: from server.gpu_ids, or locally k*n ..
    k*n+n-1 for a GPU backend; None where Slurm (or nothing) assigns them."""
    server = config["server"]
    per_slot = gpus_per_slot(config)
    devices = None
    if per_slot == 0:
        return None
    if server["gpu_ids"] is not None:
        devices = server["gpu_ids"][slot * per_slot : (slot + 1) * per_slot]
    elif server_on_gpu(config) and "SLURM_JOB_ID" not in os.environ:
        # Locally nothing assigns GPUs: slot k takes devices k*n .. k*n+n-1.
        devices = list(range(slot * per_slot, (slot + 1) * per_slot))
    return devices[0] if devices is not None and len(devices) == 1 else devices


def url_server(config: dict[str, Any], slot: int, checkpoint: str | None = None) -> dict:
    """Slot `slot`'s `server.url` part for the serve job (backend url): its URL and the field
    that names it, the readiness path of the family's endpoint, and the section's fields."""
    section = config["server"]["url"]
    field, url = slot_urls(config, checkpoint)[slot]
    endpoint = families.connection_spec(url, _family(config).name, family_settings(config))
    return {
        "url": url,
        "source": field,
        "health_path": endpoint.health_path,
        "model_id": section["model_id"],
        "connect_timeout_s": section["connect_timeout_s"],
    }


def server_settings(config: dict[str, Any], slot: int) -> ServerSettings:
    """Settings of slot `slot`'s server, checked (`ServerSettingsError` names the field); the
    `serve` rule hands them to `libero_eval.serve.job` as `to_json()`, which reads them back."""
    server = config["server"]
    gpu_id = slot_gpu_ids(config, slot)
    # server.reference's own fields as the reference server names them
    # (reference.settings.ReferenceServerSettings); the family's fields of it, by the family
    family = _family(config)
    reference = {key: server["reference"][key] for key in settings_schema.reference_fields()}
    reference["model_name"] = f"reference-{reference['policy']}"
    reference["family"] = family.name
    reference["family_module"] = families.module_of(family.name)
    if family.reference is not None:  # the family's own fields, or what its part makes of them
        own = settings_schema.family_reference_fields(family.name)
        taken = family.reference.settings
        reference["family_settings"] = (
            taken(config) if taken else {key: server["reference"][key] for key in own}
        )
    sglang = dict(server["sglang"])
    extra = [str(arg) for arg in sglang.get("extra_args") or []]
    warmup = family.sglang_warmup if server["backend"] == "sglang" else None
    if warmup is not None and not any(arg.startswith("--warmup") for arg in extra):
        # SGLang's own warm-up at the run's request shape (the family says which)
        sglang["extra_args"] = [*extra, *warmup(config)]
    own = None
    if family.server is not None:  # server.backend family: the family's own server
        own = {"command": list(family.server.command), "health_path": family.server.health_path}
    return ServerSettings.from_dict(
        {
            "backend": server["backend"],
            "slot": slot,
            "host": server["host"],
            # sglang serve also binds its HTTP port + 1 (its ZMQ broker): slots step by 2 there
            "port": server["port"] + slot * (2 if server["backend"] == "sglang" else 1)
            if server["port"]
            else 0,
            "health_timeout_s": server["health_timeout_s"],
            "teardown_grace_s": server["teardown_grace_s"],
            "cpu_threads": server["cpu_threads"],
            "gpu_id": gpu_id,
            "reference": reference,
            "sglang": sglang,
            "openpi": dict(server["openpi"]),
            "family": own,
            "url": url_server(config, slot) if server["backend"] == "url" else None,
        }
    )
