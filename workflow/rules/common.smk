import json
import sys
import time
from functools import cached_property
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

# Before the package's imports: when this process began Snakemake's work (its launch, even where
# a shell exec'd Snakemake after other commands: libero_eval.analysis.timeline.launch_epoch)
PARSED_AT = (time.time(), time.process_time())

from libero_eval.checkpoints import checkpoint_record, what_changed
from libero_eval.config import (
    ConfigError,
    check_config,
    check_family_fields,
    validate_config,
)
from libero_eval.config_server import gpu_pool
from libero_eval.eventlog import log_event
from libero_eval.serve.command import exposure_warning
from libero_eval.config_server import url_backend_warnings
from libero_eval.interrupt import StopJobsOnSignal
from libero_eval.suites import is_perturbation
from libero_eval.store import EpisodeStore
from libero_eval.analysis.timeline import record_end, record_launch

try:
    # the config's own families registered (policy.family_modules) and an older layout
    # upgraded, with a warning, before validation fills in defaults; the schema checked then
    # has every registered family's section (libero_eval.settings_schema.validate)
    for deprecation in check_family_fields(config):
        print(f"Config warning: {deprecation}", file=sys.stderr)
    validate_config(config)
except ConfigError as error:
    raise WorkflowError(f"Invalid config: {error}")
RUN = config["run_id"]
try:
    # Everything the rules need from the config, each part derived once (libero_eval.config);
    # a training run's checkpoints hashed, the hashes of unchanged files kept in a cache.
    SETTINGS = check_config(
        config, hash_cache=".snakemake/libero_eval/checkpoint_file_hashes.json"
    )
except ConfigError as error:
    raise WorkflowError(f"Invalid config: {error}")

# once per run (not again in the jobs Snakemake spawns): a host other than loopback exposes
# the unauthenticated policy servers; servers the user runs (server.backend url) on another
# host, or not named by their weights (libero_eval.config_server.url_backend_warnings)
if workflow.is_main_process:
    if config["server"]["backend"] != "url" and (
        exposed := exposure_warning(config["server"]["host"])
    ):
        print(f"Config warning: {exposed}", file=sys.stderr)
    for said in url_backend_warnings(config):
        print(f"Config warning: {said}", file=sys.stderr)
RUN = config["run_id"]
# The serve rule's interpreter: under `--sdm conda` the rule's own environment's `python`
# (its `conda:` env is on PATH); otherwise the interpreter Snakemake runs in, which need not be
# first on PATH (e.g. `.venv/bin/snakemake` without activating the venv).
PYTHON = (
    "python"
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    else sys.executable
)
SHARDS = {shard.name: shard for shard in SETTINGS.shards}
SLOTS = sorted({shard.slot for shard in SHARDS.values()})
EVENT_LOG = f"logs/{RUN}/eval_embodiment.log"


class Evaluated:
    """One evaluated model: the run itself, or one checkpoint of a training run
    (results/<run>/checkpoints/<name>/, a single run's layout). Its settings, where its
    results and logs go, its rollout fingerprint and episode store."""

    def __init__(self, settings, results, logs):
        self.settings, self.results, self.logs = settings, results, logs
        self.event_log = f"{logs}/eval_embodiment.log"

    @cached_property
    def fingerprint(self):
        return self.settings.fingerprint

    @cached_property
    def store(self):
        return EpisodeStore(f"{self.results}/episodes/{self.fingerprint}")


# A training run (`checkpoints:`): each checkpoint is evaluated as a run of its own, on the
# same plan (libero_eval.checkpoints); else the run evaluates the server's one model.
TRAINING_RUN = SETTINGS.is_training_run
CHECKPOINTS = {c.name: c for c in SETTINGS.checkpoints} if TRAINING_RUN else {}
EVALUATED = {
    name: Evaluated(
        SETTINGS.for_checkpoint(checkpoint),
        f"results/{RUN}/checkpoints/{name}",
        f"logs/{RUN}/checkpoints/{name}",
    )
    for name, checkpoint in CHECKPOINTS.items()
}
SINGLE = None if TRAINING_RUN else Evaluated(SETTINGS, f"results/{RUN}", f"logs/{RUN}")
FINGERPRINT = SINGLE.fingerprint if SINGLE else None
STORE = SINGLE.store if SINGLE else None
ACTION_STATS = SINGLE.settings.action_stats if SINGLE else None
# A training run's GPU servers take free GPUs from this pool, locally (serve.gpu_pool)
GPU_POOL = gpu_pool(config, training_run=TRAINING_RUN)
if workflow.is_main_process and TRAINING_RUN:
    for note in SETTINGS.listed_checkpoints[1]:
        print(f"Checkpoints: {note}", file=sys.stderr)
    limit = workflow.global_resources.get("gpu")
    if GPU_POOL and (
        limit is None or limit.value is None or limit.value > len(GPU_POOL)
    ):
        print(
            f"Config warning: each checkpoint's server takes a GPU of {GPU_POOL}: run with "
            f"--resources gpu={len(GPU_POOL)} so that Snakemake starts no more servers than "
            "there are GPUs (a server started beyond them waits for a GPU while its shards' "
            "wait counts against server.health_timeout_s)",
            file=sys.stderr,
        )


wildcard_constraints:
    run=RUN,
    shard=r"shard\d{3}",
    slot=r"\d+",


def get_final_output():
    if (
        TRAINING_RUN
    ):  # each checkpoint's outputs and the learning curve (checkpoints.smk)
        return [*get_checkpoint_outputs(), *rules.learning_curve.output]
    return [
        *rules.aggregate.output,
        *get_report_outputs(),
        *get_compare_outputs(),
        *get_selftest_outputs(),
    ]


def evaluated(wildcards):
    """The model a job evaluates: a checkpoint of a training run ({checkpoint}), or the run's."""
    name = wildcards.get("checkpoint")
    return EVALUATED[name] if name is not None else SINGLE


def get_report_outputs():
    """Report material of this run: figures and tables, the video page if videos are on, and
    the robustness report if the plan has LIBERO-PRO perturbation suites."""
    outputs = [*rules.report_figures.output, *rules.report_efficiency.output]
    if config["rollout"]["videos"]["enabled"]:
        outputs += rules.report_videos.output
    if any(is_perturbation(e.suite) for s in SHARDS.values() for e in s.episodes):
        outputs += rules.report_robustness.output
    return outputs


def get_compare_outputs():
    """The configured comparison (compare.baseline and compare.candidate), or nothing."""
    runs = {role: config["compare"][role] for role in ("baseline", "candidate")}
    if not all(runs.values()):
        return []
    return expand(rules.compare_runs.output, **runs)


def get_compare_target(wildcards):
    if not get_compare_outputs():
        raise WorkflowError(
            "The compare target needs two run ids: set compare.baseline and "
            "compare.candidate in the config, or pass "
            "--config compare='{baseline: <run>, candidate: <run>}'"
        )
    return get_compare_outputs()


def get_compared_episodes(wildcards):
    """Both runs' per-episode tables; a run other than this config's must already exist."""
    paths = {}
    for role in ("baseline", "candidate"):
        run = wildcards[role]
        path = f"results/{run}/summary/episodes.parquet"
        if run != RUN and not Path(path).is_file():
            raise WorkflowError(
                f"compare.{role}: {path} does not exist, so run {run!r} cannot be compared. "
                f"Produce it first with `snakemake --cores all --configfile <config of {run}> "
                f"--config run_id={run}`, or fix the run id."
            )
        paths[role] = path
    return paths


def get_selftest_outputs():
    """The self-test verdict, when config selftest.min_success_once is set."""
    if config["selftest"]["min_success_once"] is None:
        return []
    return rules.selftest.output


def get_shard_outputs(wildcards):
    results = evaluated(wildcards).results
    return [f"{results}/shards/{shard}.parquet" for shard in sorted(SHARDS)]


def get_dispatch_logs(wildcards):
    """Every shard's dispatch log (the rollout rule's second output)."""
    results = evaluated(wildcards).results
    return [f"{results}/shards/{shard}.dispatch.json" for shard in sorted(SHARDS)]


def get_service_files(wildcards):
    """slot -> its service file, with the server's capacity probe. Not an input (a
    service output is never up to date): read when it is still there."""
    return {slot: service_file(evaluated(wildcards), slot) for slot in SLOTS}


def get_serve_logs(wildcards):
    """slot -> its serve log (what the server said of its CUDA graphs). Not an input: a
    slot whose episodes were all reused has no new log."""
    return {slot: serve_log(evaluated(wildcards), slot) for slot in SLOTS}


def service_file(model, slot):
    return f"{model.results}/servers/slot{slot}.json"  # the serve rules' output


def serve_log(model, slot):
    return f"{model.logs}/serve/slot{slot}.log"  # the serve rules' log


def get_server_of_shard(wildcards):
    """The slot's service, only while some of the shard's episodes are unfinished.

    A service output always counts as missing; consuming it unconditionally would rerun
    every finished shard. A finished shard is rebuilt from the episode store without a server.
    """
    shard = SHARDS[wildcards.shard]
    if len(evaluated(wildcards).store.finished(shard.episodes)) == len(shard.episodes):
        return []
    return get_service_file_of_shard(wildcards)


def get_service_file_of_shard(wildcards):
    """The service file of the shard's slot (the serve rule's output)."""
    return service_file(evaluated(wildcards), SHARDS[wildcards.shard].slot)


def get_serve_log_of_shard(wildcards):
    """The log of the shard's slot's server (quoted when the server is unavailable)."""
    return serve_log(evaluated(wildcards), SHARDS[wildcards.shard].slot)


def get_server_settings(wildcards):
    return evaluated(wildcards).settings.server(int(wildcards.slot)).to_json()


def get_capacity_probe(wildcards):
    """How the serve job measures its server's capacity (libero_eval.policy.capacity)."""
    probe = evaluated(wildcards).settings.capacity_probe
    return json.dumps(probe.to_dict(), sort_keys=True)


def get_gpu_pool_args(wildcards):
    """A training run's serve job takes free GPUs of the pool (libero_eval.serve.gpu_pool)."""
    if not (TRAINING_RUN and GPU_POOL):
        return ""
    pool = ",".join(map(str, GPU_POOL))
    return f"--gpu-pool {pool} --gpu-lock-dir .snakemake/libero_eval/gpu_locks"


def get_fingerprint(wildcards):
    return evaluated(wildcards).fingerprint


def get_store(wildcards):
    return str(evaluated(wildcards).store.root)


def get_event_log(wildcards):
    return evaluated(wildcards).event_log


def get_video_dir(wildcards):
    return f"{evaluated(wildcards).results}/videos"


def get_envs_per_shard(wildcards=None):
    return SETTINGS.envs_per_shard


STOP = StopJobsOnSignal()


def on_start():
    """An invocation says when it was launched in the event log (`libero-eval status` counts
    its elapsed time from that line, the report its timeline). A TERM or INT to Snakemake alone stops the
    running jobs now, not after they finish (libero_eval.interrupt); local runs only: on
    Slurm, Ctrl-C cancels the jobs (scancel)."""
    rollouts = [
        j
        for j in workflow.dag.needrun_jobs()
        if getattr(j, "name", "") in ("rollout", "checkpoint_rollout")
    ]
    # the run's launch, for the report's "where the wall time went" (libero_eval.analysis.timeline)
    record_launch(EVENT_LOG, len(rollouts), PARSED_AT)
    for (
        name,
        model,
    ) in EVALUATED.items():  # a checkpoint whose files changed since it ran
        changed = what_changed(
            Path("results") / RUN, CHECKPOINTS[name], model.fingerprint
        )
        if changed:
            print(f"Checkpoints: {changed}", file=sys.stderr)
            log_event(model.event_log, "workflow", changed)
    if workflow.local_exec:
        STOP.install()


def say_if_interrupted():
    message = STOP.explain(STORE.root if STORE else Path(f"results/{RUN}/checkpoints"))
    if message:
        print(f"\n{message}", file=sys.stderr)


def print_summary():
    """After a successful run, what its targets asked for: the run's summary, and each
    comparison among them (`snakemake compare` prints only the comparison)."""
    wanted = {
        str(f) for job in workflow.dag.targetjobs for f in [*job.input, *job.output]
    }
    # a training run's summary is its learning curve (checkpoints.smk)
    summary = (
        f"results/{RUN}/learning_curve/learning_curve.md"
        if TRAINING_RUN
        else f"results/{RUN}/summary/summary.md"
    )
    comparisons = sorted(f for f in wanted if Path(f).name == "comparison.md")
    shown = [summary] if summary in wanted or not comparisons else []
    for path in map(Path, shown + comparisons):
        if path.exists():
            print(f"\n{path.read_text()}")


def slurm_placement(server=False):
    """Slurm partition/account (and the server's GPU model) from config `slurm`; unset
    fields add nothing, so the profile's default-resources apply."""
    slurm = config["slurm"]
    placement = {
        key: slurm[field]
        for key, field in (
            ("slurm_partition", "partition"),
            ("slurm_account", "account"),
        )
        if slurm[field]
    }
    if server and slurm["gpu_model"] and SETTINGS.server_on_gpu:
        placement["gpu_model"] = slurm["gpu_model"]
    return placement


def get_slot_runtime(wildcards, attempt):
    """Minutes of a slot job (server + shards: Snakemake takes the max in a group)."""
    minutes = config["slurm"]["runtime_min"] or config["rollout"]["runtime_min"]
    return minutes * attempt


def get_leaderboard_summaries(wildcards):
    """Every run under results/ that has a summary, each checkpoint of a training run as a
    run (the leaderboard reads them all)."""
    patterns = ("*/summary/summary.parquet", "*/checkpoints/*/summary/summary.parquet")
    return sorted(str(p) for pattern in patterns for p in Path("results").glob(pattern))


# --- a training run (checkpoints.smk) ---


def get_checkpoint_outputs():
    """Every checkpoint's summary and report, as a single run's."""
    rules_of_each = [
        rules.checkpoint_aggregate,
        rules.checkpoint_report_figures,
        rules.checkpoint_report_efficiency,
    ]
    if config["rollout"]["videos"]["enabled"]:
        rules_of_each.append(rules.checkpoint_report_videos)
    if any(is_perturbation(e.suite) for s in SHARDS.values() for e in s.episodes):
        rules_of_each.append(rules.checkpoint_report_robustness)
    return [
        path
        for rule in rules_of_each
        for path in expand(rule.output, checkpoint=sorted(CHECKPOINTS))
    ]


def get_checkpoint(wildcards):
    """The checkpoint as its jobs get it (libero_eval.checkpoint_identity.Checkpoint)."""
    return CHECKPOINTS[wildcards.checkpoint].for_jobs()


def get_checkpoint_record(wildcards):
    """What the checkpoint's summary records of it: name, path, step, files, fingerprint."""
    model = EVALUATED[wildcards.checkpoint]
    return checkpoint_record(CHECKPOINTS[wildcards.checkpoint], model.fingerprint)


def get_checkpoint_summaries(wildcards):
    """Each checkpoint's summary, for the learning curve."""
    names = list(CHECKPOINTS)
    return {
        key: expand(path, checkpoint=names)
        for key, path in rules.checkpoint_aggregate.output.items()
        if key in ("episodes", "per_suite", "per_seed", "checkpoint")
    }
