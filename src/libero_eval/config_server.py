"""A slot's server, from the checked config: the GPUs it is pinned to, its port, its settings
for the serve job (`ServerSettings`, JSON on the serve rule's command line), whether it runs on
a GPU, and the part of it that changes actions (in the rollout fingerprint). The config's
policy family is registered first (`config.RunSettings`, `config.check_config`).

With `server.backend: url` a slot's server is one the user already runs: `slot_urls` reads
its URL from `server.url.urls` (a list, one per slot; or, for a run of several checkpoints,
a mapping of checkpoint names to such lists, read with the checkpoint's name).

In a run of several checkpoints (`checkpoints:`) each checkpoint's slots run with the `server`
section `checkpoint_server` gives: the config's, with the checkpoint in the place its backend
names the model (:data:`CHECKPOINT_SERVERS`, one function per backend)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from libero_eval import settings_schema
from libero_eval.checkpoint_identity import REFERENCE_CHECKPOINT_FILE, Checkpoint
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
            "the weights (and change it when they change; docs/training_runs.md, 'Servers you "
            "run')"
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


def _url_checkpoint(server: dict[str, Any], checkpoint: Checkpoint) -> None:
    urls = server["url"]["urls"]
    if not isinstance(urls, dict):
        return  # one checkpoint: the servers `server.url.urls` lists
    if checkpoint.name not in urls:
        raise CheckpointFormatError(
            f"{URLS_FIELD} lists no servers for checkpoint {checkpoint.name!r} (it names "
            f"{', '.join(sorted(urls)) or 'none'}): add its URLs under its name"
        )
    server["url"]["urls"] = list(urls[checkpoint.name])


#: server.backend -> how a checkpoint becomes that backend's `server` section (in place). A
#: backend not listed cannot evaluate checkpoints (`checkpoints:` is refused with it).
CHECKPOINT_SERVERS: dict[str, Callable[[dict[str, Any], Checkpoint], None]] = {
    "sglang": _sglang_checkpoint,
    "reference": _reference_checkpoint,
    "openpi": _openpi_checkpoint,
    "url": _url_checkpoint,
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
