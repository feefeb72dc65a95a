"""A slot's server, from the checked config: the GPUs it is pinned to, its port, its settings
for the serve job (`ServerSettings`, JSON on the serve rule's command line), whether it runs on
a GPU, and the part of it that changes actions (in the rollout fingerprint). The config's
policy family is registered first (`config.RunSettings`, `config.check_config`).

In a run of several checkpoints (`checkpoints:`) each checkpoint's slots run with the `server`
section `checkpoint_server` gives: the config's, with the checkpoint in the place its backend
names the model (:data:`CHECKPOINT_SERVERS`, one function per backend)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libero_eval import package_data, settings_schema
from libero_eval.checkpoint_identity import REFERENCE_CHECKPOINT_FILE, Checkpoint
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
        outcome = _family(config).reference_outcome
        assert outcome is not None, "check_config refuses a family the reference cannot serve"
        return outcome(config)
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


def visible_gpus() -> list[int]:
    """This machine's GPUs as CUDA numbers them: CUDA_VISIBLE_DEVICES where it lists ids, else
    one per entry of /proc/driver/nvidia/gpus (the NVIDIA driver's); empty without a GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        parts = [p.strip() for p in visible.split(",") if p.strip()]
        if all(p.isdigit() for p in parts):
            return [int(p) for p in parts]
    gpus = Path("/proc/driver/nvidia/gpus")
    return list(range(len(list(gpus.iterdir())))) if gpus.is_dir() else []


def gpu_pool(config: dict[str, Any], training_run: bool) -> list[int] | None:
    """The GPUs a training run's servers take one by one, locally (`serve.gpu_pool`): its
    checkpoints' servers start as others finish, so no slot index names a GPU.
    `server.gpu_ids`, else every GPU :func:`visible_gpus` finds. None where the slot pins its
    GPUs as in a single run, or Slurm assigns them, or the server runs on no GPU."""
    if not training_run or not server_on_gpu(config) or "SLURM_JOB_ID" in os.environ:
        return None
    ids = config["server"]["gpu_ids"]
    return list(ids) if ids is not None else (visible_gpus() or None)


def server_settings(config: dict[str, Any], slot: int) -> ServerSettings:
    """Settings of slot `slot`'s server, checked (`ServerSettingsError` names the field); the
    `serve` rule hands them to `libero_eval.serve.job` as `to_json()`, which reads them back."""
    server = config["server"]
    gpu_id = slot_gpu_ids(config, slot)
    # server.reference as the reference server's own settings name them
    # (reference.settings.ReferenceServerSettings), the family's part by the family
    family = _family(config)
    reference = dict(server["reference"])
    reference["model_name"] = f"reference-{reference['policy']}"
    reference["action_stats_path"] = str(package_data.resolve(reference["action_stats_path"]))
    if family.reference_settings is not None:
        reference = family.reference_settings(config, reference)
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


# --------------------------------------------------------------------------- checkpoints

# Where openpi's server command takes the checkpoint directory (e.g. `policy:checkpoint
# --policy.dir={checkpoint}`, openpi scripts/serve_policy.py's Checkpoint(dir=...)).
CHECKPOINT_PLACEHOLDER = "{checkpoint}"


class CheckpointFormatError(ValueError):
    """A directory is not a checkpoint of the run's backend; the message says what it lacks."""


def reference_checkpoint(directory: str | Path) -> dict[str, Any]:
    """The `server.reference` fields a reference-server checkpoint sets: the mapping in its
    ``reference_checkpoint.yaml`` (docs/training_runs.md), each key a `server.reference` field
    (or ``step``, its training step, read by `checkpoint_identity.read_step`), each value
    checked against that field's schema; a path field (``*_path``) relative to the directory.
    `CheckpointFormatError` names the file and the key."""
    path = Path(directory) / REFERENCE_CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointFormatError(
            f"no {REFERENCE_CHECKPOINT_FILE}: a reference-server checkpoint is a directory "
            f"holding one, whose keys are server.reference fields (policy: hold or scripted, "
            "action_stats_path, ...) and optionally step (docs/training_runs.md)"
        )
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CheckpointFormatError(f"{path}: cannot read it as YAML ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{path}: expected a mapping of server.reference fields")
    section = settings_schema.section("server", "reference")["properties"]
    settings = {}
    for key, value in data.items():
        if key == "step":
            continue
        if key not in section:
            raise CheckpointFormatError(
                f"{path}: {key!r} is not a server.reference field (known: "
                f"{', '.join(sorted(section))}, and step)"
            )
        problems = settings_schema.messages(value, section[key], f"{path}: {key}", fill=False)
        if problems:
            raise CheckpointFormatError("; ".join(problems))
        if key.endswith("_path") and isinstance(value, str) and ":" not in value:
            value = str((Path(directory) / value).resolve())  # relative to the checkpoint
        settings[key] = value
    return settings


def _sglang_checkpoint(server: dict[str, Any], checkpoint: Checkpoint) -> None:
    server["sglang"]["model_path"] = checkpoint.path


def _reference_checkpoint(server: dict[str, Any], checkpoint: Checkpoint) -> None:
    assert checkpoint.path is not None
    server["reference"].update(reference_checkpoint(checkpoint.path))


def _openpi_checkpoint(server: dict[str, Any], checkpoint: Checkpoint) -> None:
    command = server["openpi"]["command"] or []
    if not any(CHECKPOINT_PLACEHOLDER in arg for arg in command):
        raise CheckpointFormatError(
            f"server.openpi.command names no {CHECKPOINT_PLACEHOLDER}: write it where openpi's "
            "server takes the checkpoint directory, e.g. policy:checkpoint "
            f"--policy.dir={CHECKPOINT_PLACEHOLDER}"
        )
    server["openpi"]["command"] = [
        arg.replace(CHECKPOINT_PLACEHOLDER, str(checkpoint.path)) for arg in command
    ]


#: server.backend -> how a checkpoint becomes that backend's `server` section (in place). A
#: backend not listed cannot evaluate checkpoints (`checkpoints:` is refused with it).
CHECKPOINT_SERVERS: dict[str, Callable[[dict[str, Any], Checkpoint], None]] = {
    "sglang": _sglang_checkpoint,
    "reference": _reference_checkpoint,
    "openpi": _openpi_checkpoint,
}
#: Backends whose checkpoints are named, not directories (servers the user runs, by URL).
PATHLESS_BACKENDS = ("url",)


def checkpoint_server(config: dict[str, Any], checkpoint: Checkpoint) -> dict[str, Any]:
    """The `server` section `checkpoint`'s slots run with: a copy of the config's, with the
    checkpoint where the backend names its model (sglang: `server.sglang.model_path`; the
    reference server: the `server.reference` fields of its ``reference_checkpoint.yaml``;
    openpi: ``{checkpoint}`` in `server.openpi.command`). `CheckpointFormatError` when the
    checkpoint does not fit the backend."""
    server = copy.deepcopy(config["server"])
    apply = CHECKPOINT_SERVERS.get(server["backend"])
    if apply is None:
        raise CheckpointFormatError(
            f"server.backend {server['backend']} cannot evaluate checkpoints: use one of "
            f"{', '.join(CHECKPOINT_SERVERS)}"
        )
    apply(server, checkpoint)
    return server
