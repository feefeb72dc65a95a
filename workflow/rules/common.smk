import json
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

from libero_eval.config import (
    ConfigError,
    check_config,
    check_family_fields,
    validate_config,
)
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
try:
    # Everything the rules need from the config, each part derived once (libero_eval.config).
    SETTINGS = check_config(config)
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
FINGERPRINT = SETTINGS.fingerprint
EVENT_LOG = f"logs/{RUN}/eval_embodiment.log"
STORE = EpisodeStore(f"results/{RUN}/episodes/{FINGERPRINT}")


wildcard_constraints:
    run=RUN,
    shard=r"shard\d{3}",
    slot=r"\d+",


def get_final_output():
    return [
        *rules.aggregate.output,
        *get_report_outputs(),
        *get_compare_outputs(),
        *get_selftest_outputs(),
    ]


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
    return expand("results/{run}/shards/{shard}.parquet", run=RUN, shard=sorted(SHARDS))


def get_dispatch_logs(wildcards):
    """Every shard's dispatch log (the rollout rule's second output)."""
    return expand(rules.rollout.output.dispatch, run=RUN, shard=sorted(SHARDS))


def get_service_files(wildcards):
    """slot -> its service file, with the server's capacity probe. Not an input (a
    service output is never up to date): read when it is still there."""
    template = rules.serve.output[0]
    return {slot: expand(template, run=RUN, slot=slot)[0] for slot in SLOTS}


def get_serve_logs(wildcards):
    """slot -> its serve log (what the server said of its CUDA graphs). Not an input: a
    slot whose episodes were all reused has no new log."""
    template = rules.serve.log[0]
    return {slot: expand(template, run=RUN, slot=slot)[0] for slot in SLOTS}


def get_server_of_shard(wildcards):
    """The slot's service, only while some of the shard's episodes are unfinished.

    A service output always counts as missing; consuming it unconditionally would rerun
    every finished shard. A finished shard is rebuilt from the episode store without a server.
    """
    shard = SHARDS[wildcards.shard]
    if len(STORE.finished(shard.episodes)) == len(shard.episodes):
        return []
    return get_service_file_of_shard(wildcards)


def get_service_file_of_shard(wildcards):
    """The service file of the shard's slot (the serve rule's output)."""
    return expand(rules.serve.output[0], run=RUN, slot=SHARDS[wildcards.shard].slot)[0]


def get_serve_log_of_shard(wildcards):
    """The log of the shard's slot's server (quoted when the server is unavailable)."""
    return expand(rules.serve.log[0], run=RUN, slot=SHARDS[wildcards.shard].slot)[0]


def get_server_settings(wildcards):
    return SETTINGS.server(int(wildcards.slot)).to_json()


def get_capacity_probe(wildcards):
    """How the serve job measures its server's capacity (libero_eval.policy.capacity)."""
    return json.dumps(SETTINGS.capacity_probe.to_dict(), sort_keys=True)


def get_envs_per_shard(wildcards=None):
    return SETTINGS.envs_per_shard


STOP = StopJobsOnSignal()


def on_start():
    """An invocation says when it was launched in the event log (`libero-eval status` counts
    its elapsed time from that line, the report its timeline). A TERM or INT to Snakemake alone stops the
    running jobs now, not after they finish (libero_eval.interrupt); local runs only: on
    Slurm, Ctrl-C cancels the jobs (scancel)."""
    rollouts = [
        j for j in workflow.dag.needrun_jobs() if getattr(j, "name", "") == "rollout"
    ]
    # the run's launch, for the report's "where the wall time went" (libero_eval.analysis.timeline)
    record_launch(EVENT_LOG, len(rollouts))
    if workflow.local_exec:
        STOP.install()


def say_if_interrupted():
    message = STOP.explain(STORE.root)
    if message:
        print(f"\n{message}", file=sys.stderr)


def print_summary():
    """After a successful run, what its targets asked for: the run's summary, and each
    comparison among them (`snakemake compare` prints only the comparison)."""
    wanted = {
        str(f) for job in workflow.dag.targetjobs for f in [*job.input, *job.output]
    }
    summary = f"results/{RUN}/summary/summary.md"
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
    """Every run under results/ that has a summary (the leaderboard reads them all)."""
    return sorted(str(p) for p in Path("results").glob("*/summary/summary.parquet"))
