"""A slot's server, from the checked config: the GPUs it is pinned to, its port, its settings
for the serve job (`ServerSettings`, JSON on the serve rule's command line), whether it runs on
a GPU, and the part of it that changes actions (in the rollout fingerprint). The config's
policy family is registered first (`config.RunSettings`, `config.check_config`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from libero_eval import settings_schema
from libero_eval.policy import families
from libero_eval.policy.families import Family
from libero_eval.serve.settings import ServerSettings

# Backends whose server is a GPU process run by a command of its own (not the reference).
GPU_BACKENDS = ("sglang", "openpi")


def _family(config: dict[str, Any]) -> Family:
    return families.get(config["policy"]["family"])


def server_policy_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The server-side settings that change actions (part of the rollout fingerprint)."""
    server = config["server"]
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
    server = config["server"]
    return server["sglang"]["num_gpus"] if server["backend"] == "sglang" else 1


def slot_gpu_ids(config: dict[str, Any], slot: int) -> int | list[int] | None:
    """The GPU(s) slot `slot`'s server is pinned to: from server.gpu_ids, or locally k*n ..
    k*n+n-1 for a GPU backend; None where Slurm (or nothing) assigns them."""
    server = config["server"]
    per_slot = gpus_per_slot(config)
    devices = None
    if server["gpu_ids"] is not None:
        devices = server["gpu_ids"][slot * per_slot : (slot + 1) * per_slot]
    elif server_on_gpu(config) and "SLURM_JOB_ID" not in os.environ:
        # Locally nothing assigns GPUs: slot k takes devices k*n .. k*n+n-1.
        devices = list(range(slot * per_slot, (slot + 1) * per_slot))
    return devices[0] if devices is not None and len(devices) == 1 else devices


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
        }
    )
